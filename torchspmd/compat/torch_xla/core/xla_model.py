"""``torch_xla.core.xla_model`` (``xm``) under SPMD: one virtual device per process.

Example::

    import torch_xla.core.xla_model as xm
    x = torch.ones(4, device=xm.xla_device()) * 2
    xm.mark_step()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch

import torchspmd
import torchspmd.runtime as xr
from torchspmd.compat import step_closures
from torchspmd.compat.errors import refusing, unsupported

_COLLECTIVE = ("under SPMD, shard tensors with torch_xla.distributed.spmd.mark_sharding and "
               "XLA inserts the collectives")

# Reduction names scripts pass to the (refused) collectives, PyTorch/XLA's values.
REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX = (
    "sum", "mul", "and", "or", "min", "max")


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The spmd device (``xla:0``)."""
    if n not in (None, 0):
        unsupported(f"xm.xla_device({n})", "under SPMD there is one virtual device; use "
                    "xm.xla_device() and a Mesh to place work on some devices")
    return torchspmd.device()


def xla_device_hw(device: Any = None) -> str:
    """The platform of the devices: ``'CPU'``, ``'GPU'`` or ``'TPU'``."""
    platform = jax.devices()[0].platform.upper()
    return "GPU" if platform in ("CUDA", "ROCM") else platform


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None):
    """``['xla:0']``: the one virtual device."""
    return ["xla:0"]


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """``torchspmd.sync``, then the queued step closures."""
    torchspmd.sync(wait=wait)
    step_closures.run()


def wait_device_ops(devices: Sequence[str] = ()) -> None:
    """``torchspmd.wait_device_ops``."""
    torchspmd.wait_device_ops()


def add_step_closure(closure: Callable, args: Sequence = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next ``mark_step``/``sync``/compiled call."""
    step_closures.add(closure, args)


def get_ordinal(defval: int = 0) -> int:
    """This process's index (``torch_xla.runtime.global_ordinal``)."""
    return xr.global_ordinal()


def get_local_ordinal(defval: int = 0) -> int:
    """This process's index on its host."""
    return xr.local_ordinal()


def xrt_world_size(defval: int = 1) -> int:
    """The number of processes (``torch_xla.runtime.world_size``)."""
    return xr.world_size()


world_size = xrt_world_size


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process is the first (on its host if ``local``)."""
    return xr.is_master_ordinal(local=local)


def master_print(*args: Any, fd: Any = None, **kwargs: Any) -> None:
    """``print`` on the master process only."""
    if is_master_ordinal(local=False):
        print(*args, file=fd, **kwargs)


def optimizer_step(optimizer: torch.optim.Optimizer, barrier: bool = False,
                   optimizer_args: dict | None = None, groups: Any = None,
                   pin_layout: bool = True) -> Any:
    """``optimizer.step()``: under SPMD the gradients are already those of the global batch."""
    result = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return result


def get_memory_info(device: Any = None) -> dict[str, int]:
    """PyTorch/XLA's memory numbers (``bytes_used``, ``bytes_limit``, ``peak_bytes_used``)
    of this process's first device, from JAX's memory statistics.

    Example: ``xm.get_memory_info(xm.xla_device())["bytes_used"]``.
    """
    first = jax.local_devices()[0]
    stats = first.memory_stats()
    if not stats:
        raise NotImplementedError(
            f"torchspmd.compat: xm.get_memory_info: the {first.platform} backend reports no "
            "memory statistics (JAX's memory_stats() is None); a compiled step's "
            "memory_analysis() gives what XLA planned for it.")
    return {"bytes_used": stats.get("bytes_in_use", 0),
            "bytes_limit": stats.get("bytes_limit", 0),
            "peak_bytes_used": stats.get("peak_bytes_in_use", 0)}


def set_rng_state(seed: int, device: Any = None) -> None:
    """``torchspmd.manual_seed``."""
    torchspmd.manual_seed(seed)


class RateTracker:
    """Items per second, smoothed (``tracker.add(batch_size); tracker.rate()``)."""

    def __init__(self, smooth_factor: float | None = None):
        self._smooth = 0.4 if smooth_factor is None else smooth_factor
        self._start = self._last = time.monotonic()
        self._count = self._partial = 0
        self._rate = 0.0

    def add(self, count: int) -> None:
        self._count += count
        self._partial += count

    def _update(self, now: float) -> float:
        if now > self._last:
            rate = self._partial / (now - self._last)
            self._rate = rate if not self._rate else (
                self._smooth * self._rate + (1 - self._smooth) * rate)
            self._partial, self._last = 0, now
        return self._rate

    def rate(self) -> float:
        return self._update(time.monotonic())

    def global_rate(self) -> float:
        elapsed = time.monotonic() - self._start
        return self._count / elapsed if elapsed > 0 else 0.0


all_reduce = refusing("xm.all_reduce", _COLLECTIVE)
all_gather = refusing("xm.all_gather", _COLLECTIVE)
reduce_scatter = refusing("xm.reduce_scatter", _COLLECTIVE)
all_to_all = refusing("xm.all_to_all", _COLLECTIVE)
collective_permute = refusing("xm.collective_permute", _COLLECTIVE)
reduce_gradients = refusing("xm.reduce_gradients", "under SPMD gradients are already those of "
                            "the global batch: call optimizer.step()")
rendezvous = refusing("xm.rendezvous", "every process runs the same program; reading a sharded "
                      "value (.cpu(), .item()) already waits for all of them")
mesh_reduce = refusing("xm.mesh_reduce", "compute the value on sharded tensors and read it")


def save(data: Any, file_or_path: Any, master_only: bool = True,
         global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with every tensor moved to the CPU, as PyTorch/XLA's.

    Every process gathers the values (reading a sharded tensor is a collective all must
    join); with ``master_only`` only the master process writes (the first on each host,
    or the first of all with ``global_master``). For sharded state that should stay
    sharded, use ``torchspmd.checkpoint``.
    """
    from torch.utils._pytree import tree_map

    cpu = tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, data)
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(cpu, file_or_path)


def send_cpu_data_to_device(datas: Any, device: Any, input_sharding: Any = None) -> Any:
    """``torchspmd.data.send_cpu_data_to_device``: every CPU tensor in ``datas`` uploaded
    now, each device receiving only its shard of ``input_sharding``. A lone tensor comes
    back in a list, as PyTorch/XLA returns it.

    Example: ``[x] = xm.send_cpu_data_to_device(x, device, xs.ShardingSpec(mesh, (0, None)))``.
    """
    from torchspmd.data import send_cpu_data_to_device as send

    return send([datas] if type(datas) is torch.Tensor else datas, device, input_sharding)


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lives on the spmd device (PyTorch/XLA's ``xla`` device)."""
    return tensor.device.type == torchspmd.device().type


def xla_device_kind(device: Any = None) -> str:
    """The devices' kind as their runtime names it (``'cpu'``, ``'NVIDIA H100 80GB HBM3'``)."""
    return jax.devices()[0].device_kind


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"torchspmd.compat: torch_xla.core.xla_model.{name} is not served "
                         "here; docs/migrating.md lists what is, and what to use instead.")
