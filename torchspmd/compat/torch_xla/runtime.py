"""``torch_xla.runtime`` (``xr``): torchspmd's runtime queries, and SPMD always on.

Example::

    from torch_xla import runtime as xr
    xr.use_spmd()
    mesh_size = xr.global_runtime_device_count()
"""

from __future__ import annotations

import os

import jax

from torchspmd.compat.errors import unsupported
from torchspmd.runtime import (addressable_runtime_device_count, global_ordinal,  # noqa: F401
                               global_runtime_device_count, is_master_ordinal,
                               local_device_count, local_ordinal, local_process_count,
                               process_count, process_index, world_size)


def use_spmd(auto: bool = False) -> None:
    """SPMD is how torchspmd always runs; ``auto=True`` is refused: PyTorch/XLA's
    auto-sharding picks layouts hidden inside its compiler (on TPU only), torchspmd plans
    them in the open with ``torchspmd.auto_shard``. Sets ``XLA_USE_SPMD=1`` in the
    environment, as PyTorch/XLA does (scripts read it)."""
    if auto:
        unsupported("xr.use_spmd(auto=True)", "plan the shardings with "
                    "torchspmd.auto_shard(model, mesh, example_inputs, loss_fn=...) and apply "
                    "them with plan.apply(model) (docs/guides/auto-shard.md), or annotate "
                    "them with mark_sharding (or wrap the model in "
                    "SpmdFullyShardedDataParallel)")
    os.environ["XLA_USE_SPMD"] = "1"


def is_spmd() -> bool:
    """True: torchspmd always runs one SPMD program."""
    return True


def device_type() -> str:
    """The platform as PyTorch/XLA names it: ``'CPU'``, ``'CUDA'`` or ``'TPU'``.

    JAX calls an NVIDIA GPU's platform ``gpu``; PyTorch/XLA's ``PJRT_DEVICE`` and
    ``device_type()`` say ``CUDA``.
    """
    platform = jax.devices()[0].platform.upper()
    return "CUDA" if platform == "GPU" else platform


def global_runtime_device_attributes() -> list[dict]:
    """Each device's attributes, in id order: its ``name`` (``'CPU:0'``, ``'CUDA:3'``) and,
    where the runtime has them (TPU), ``coords``, ``core_on_chip``, ``num_cores`` and
    ``slice_index``, as PyTorch/XLA's.

    Example: ``[d["name"] for d in xr.global_runtime_device_attributes()]``.
    """
    kind = device_type()
    found = []
    for d in sorted(jax.devices(), key=lambda d: d.id):
        attributes = {"name": f"{kind}:{d.id}"}
        for key in ("coords", "core_on_chip", "num_cores", "slice_index"):
            value = getattr(d, key, None)
            if value is not None:
                attributes[key] = list(value) if key == "coords" else value
        found.append(attributes)
    return found


def addressable_device_count() -> int:
    """1: the process's one virtual device."""
    return 1


def global_device_count() -> int:
    """Every physical device of every process."""
    return global_runtime_device_count()


def host_index() -> int:
    """This process's index."""
    return process_index()


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep XLA's compiled programs in ``path`` (JAX's persistent compilation cache)."""
    if readonly:
        unsupported("xr.initialize_cache(readonly=True)", "JAX's cache has no read-only mode; "
                    "set TORCHSPMD_COMPILATION_CACHE=DIR")
    jax.config.update("jax_compilation_cache_dir", path)
