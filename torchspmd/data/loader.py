"""Input pipelines that upload each batch already sharded, one batch ahead of its use.

``ShardedLoader`` is PyTorch/XLA's ``MpDeviceLoader(loader, device, input_sharding=...)``
(spec §1.7) for the spmd device: every CPU tensor of a batch becomes an spmd tensor whose
devices each received only their own shard, and the next batch is sent while the current
one is being trained on. ``send_cpu_data_to_device`` is the one-batch version. Example::

    mesh = Mesh(np.arange(8), (8,), ("data",))
    loader = ShardedLoader(torch_loader, "spmd", input_sharding=ShardingSpec(mesh, ("data", None)))
    for x, y in loader:          # x, y: spmd tensors, split over 'data'
        loss = model(x, y); ...

With several processes, a ``ShardingSpec(mesh, spec, minibatch=True)`` makes each
process's loader yield its own slice of the global batch (PyTorch/XLA's multi-host
loading): the tensors the loop sees are the global batch, and each process uploads
only its slice. Without ``minibatch`` every process must yield the same whole batch
(each uploads the shards of its own devices).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

import jax
import torch
from torch.utils._pytree import tree_map

from torchspmd.device.backend import device as spmd_device
from torchspmd.runtime import transfer
from torchspmd.runtime.execute import materialize
from torchspmd.sharding import device_data, state
from torchspmd.sharding.api import ShardingSpec, mark_sharding
from torchspmd.sharding.partition_spec import resolve

__all__ = ["InputSharding", "ShardedLoader", "send_cpu_data_to_device"]

InputSharding = ShardingSpec | Mapping[str, ShardingSpec] | None


def _local_device_count(spec: ShardingSpec) -> int:
    """How many of the spec's mesh devices this process drives."""
    me = jax.process_index()
    return sum(1 for d in spec.mesh.jax_devices() if d.process_index == me)


def _check_minibatch(t: torch.Tensor, spec: ShardingSpec) -> None:
    """With ``minibatch``, each process holds a slice of the global batch (spec §1.7).

    The per-process batch must split evenly over the mesh's devices in this process
    (PyTorch/XLA counts every local device, which is the same thing unless the mesh
    is a sub-mesh).
    """
    count = _local_device_count(spec)
    if count == 0:
        raise RuntimeError(
            f"minibatch input sharding: the mesh's devices {spec.mesh.device_ids.tolist()} "
            f"include none of process {jax.process_index()}'s devices, so this process has "
            "no slice of the batch to load. Use a mesh that spans every process.")
    if t.dim() > 0 and t.shape[0] % count != 0:
        raise RuntimeError(
            "When minibatch is configured, the per-host batch size must be divisible by "
            f"local runtime device count. Per host input data shape = {t.size()}, "
            f"local_runtime_device_count = {count}")


def _upload_now(t: torch.Tensor) -> None:
    """Start the host-to-device copy of ``t``'s data now (JAX copies asynchronously)."""
    materialize([state.current_value(t)])


def _from_process_local(t: torch.Tensor, spec: ShardingSpec) -> torch.Tensor:
    """The global batch whose slice in this process is ``t`` (every process its own)."""
    sharding = resolve(spec.mesh, spec.partition_spec, t.dim()).named_sharding
    try:
        array = transfer.upload_process_local(transfer.to_numpy(t), sharding, None)
    except ValueError as error:  # JAX: the slice does not tile the devices evenly
        raise RuntimeError(
            f"minibatch input sharding: this process's batch of shape {tuple(t.shape)} "
            f"does not split evenly over the devices of {spec.partition_spec} on the mesh "
            f"({error})") from None
    return device_data.tensor_from_array(array, t.dtype, sharding)


def _send_tensor(t: Any, device: torch.device, spec: ShardingSpec | None) -> Any:
    """One CPU tensor to ``device``: sharded by ``spec`` if its rank fits, else replicated."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return t
    if spec is not None and spec.can_apply(t) and spec.minibatch:
        _check_minibatch(t, spec)
        if jax.process_count() > 1:
            return _from_process_local(t, spec)
    out = t.to(device)
    if spec is not None and spec.can_apply(t):
        mark_sharding(out, spec.mesh, spec.partition_spec)
    else:
        # No spec: replicated over every device, and reported as such (``{replicated}``).
        tensor = state.as_spmd_tensor(out)
        state.replace_leaf(tensor, state.current_value(tensor), transfer.replicated())
    _upload_now(out)
    return out


def _map_batch(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to each tensor, every container keeping its type:
    PyTorch's pytree containers (tuples, lists, dicts, named tuples), and also other
    mappings (Hugging Face's ``BatchEncoding``, a ``UserDict``) and dataclasses, which
    PyTorch's pytree would leave whole."""
    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return fn(x)
        if isinstance(x, Mapping):  # not a dict (tree_map opened those)
            out = copy.copy(x)
            for key, value in x.items():
                out[key] = _map_batch(fn, value)
            return out
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.replace(x, **{f.name: _map_batch(fn, getattr(x, f.name))
                                             for f in dataclasses.fields(x) if f.init})
        return x

    return tree_map(leaf, batch)


def _send_dict(batch: Any, device: torch.device,
               input_sharding: Mapping[str, ShardingSpec]) -> Any:
    if not isinstance(batch, Mapping):
        raise ValueError("input batch should be a dict when input sharding is a dict.")
    result, missing = copy.copy(batch), []  # a BatchEncoding stays one
    for key, value in batch.items():
        if key not in input_sharding:
            missing.append(key)
            continue
        result[key] = _send_tensor(value, device, input_sharding[key])
    if missing:
        raise KeyError(f"Keys: {missing} are missing from input_sharding.")
    return result


def send_cpu_data_to_device(data: Any, device: torch.device | str | None = None,
                            input_sharding: InputSharding = None) -> Any:
    """Upload every CPU tensor in ``data`` now (any nesting of lists, tuples, dicts, named
    tuples, other mappings such as Hugging Face's ``BatchEncoding``, and dataclasses;
    each container keeps its type).

    ``input_sharding`` is a ``ShardingSpec`` applied to each tensor whose rank matches
    it (the others are replicated), or a dict of specs for a dict batch, one per key
    (a missing key is a ``KeyError``). Each device receives only its shard. With
    ``minibatch=True`` the batch dim must divide over the mesh's local devices.

    Example::

        >>> spec = ShardingSpec(Mesh(np.arange(8), (8,), ("data",)), ("data", None))
        >>> x = send_cpu_data_to_device(torch.zeros(16, 4), "spmd", spec)
        >>> get_sharding(x)
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
    """
    device = torch.device(device) if device is not None else spmd_device()
    if isinstance(input_sharding, Mapping):
        return _send_dict(data, device, input_sharding)
    return _map_batch(lambda t: _send_tensor(t, device, input_sharding), data)


_FAILED = object()  # marks a look-ahead batch whose upload raised


class ShardedLoader:
    """Iterate ``loader``, yielding its batches uploaded to ``device``, sharded.

    Args:
      loader: any iterable of batches of CPU tensors (a ``DataLoader``, a list, ...).
      device: the spmd device (default ``torchspmd.device()``).
      input_sharding: a ``ShardingSpec`` for every tensor, or ``{key: ShardingSpec}``
        for dict batches (see ``send_cpu_data_to_device``).
      prefetch: how many batches are sent ahead of the one being used (default 1): the
        copy of batch ``i + 1`` overlaps training on batch ``i``.

    An error uploading a batch is raised when that batch is asked for, not earlier.

    Example::

        >>> spec = ShardingSpec(mesh, ("data", None))
        >>> for x, y in ShardedLoader(batches, "spmd", input_sharding=spec):
        ...     train_step(x, y)
    """

    def __init__(self, loader: Iterable, device: torch.device | str | None = None, *,
                 input_sharding: InputSharding = None, prefetch: int = 1):
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self._loader = loader
        self._device = torch.device(device) if device is not None else spmd_device()
        self._input_sharding = input_sharding
        self._prefetch = prefetch

    def __len__(self) -> int:
        return len(self._loader)

    def _send(self, batch: Any) -> tuple[Any, BaseException | None]:
        try:
            return send_cpu_data_to_device(batch, self._device, self._input_sharding), None
        except (ValueError, KeyError, RuntimeError) as error:
            return _FAILED, error

    def __iter__(self) -> Iterator[Any]:
        source = iter(self._loader)
        ahead: deque = deque()

        def send_next() -> None:
            for batch in source:
                ahead.append(self._send(batch))
                return

        for _ in range(max(self._prefetch, 1)):
            send_next()
        while ahead:
            batch, error = ahead.popleft()
            if self._prefetch > 0:
                send_next()  # in flight while the caller trains on ``batch``
            if error is not None:
                raise error
            yield batch
            if self._prefetch == 0:
                send_next()
