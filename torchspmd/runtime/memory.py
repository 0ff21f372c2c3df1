"""Refusing a program that cannot fit in device memory, before it runs.

XLA's CPU runtime does not fail cleanly when a multi-device program cannot allocate its
outputs: the program's other outputs never become ready and reading them hangs. So the
first run of each program checks XLA's memory analysis (output and temporary bytes per
device) against the memory the devices have: an accelerator's ``bytes_limit``, or for
CPU devices, which share the host's memory, the host's RAM (or the process's address
space limit, if lower). A program that cannot fit raises ``torch.OutOfMemoryError``
naming its largest value and how sharding it helps.

Example::

    big = torch.ones(2**33, device="spmd")   # 32 GiB, replicated on every device
    torchspmd.sync()                           # torch.OutOfMemoryError: ... shard it ...
"""

from __future__ import annotations

import math
import os
import resource

import jax
import torch

from torchspmd.lowering import jax_private

__all__ = ["check_fits", "out_of_memory", "is_out_of_memory"]

_GIB = float(1 << 30)


def check_fits(compiled, graph) -> None:
    """Raise ``torch.OutOfMemoryError`` if ``compiled`` (a JAX ``Compiled``) cannot fit.

    >>> check_fits(jitted.lower(*args).compile(), graph)  # doctest: +SKIP
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return
    per_device = (stats.output_size_in_bytes - stats.alias_size_in_bytes
                  + stats.temp_size_in_bytes)
    devices = _program_devices(compiled)
    need, have, where = _need_and_have(per_device, devices)
    if have is not None and need > have:
        raise out_of_memory(graph, (
            f"it needs {need / _GIB:.1f} GiB ({per_device / _GIB:.1f} GiB on each of "
            f"{len(devices)} devices) for its results and temporary values, and there is "
            f"{have / _GIB:.1f} GiB {where}"))


def _program_devices(compiled) -> list:
    shardings = jax.tree.leaves((compiled.output_shardings, compiled.input_shardings))
    for sharding in shardings:
        if isinstance(sharding, jax.sharding.Sharding):
            return list(jax_private.device_assignment(sharding))
    return []


def _need_and_have(per_device: int, devices: list) -> tuple[int, int | None, str]:
    """Bytes the program needs where memory is shared, and what is there."""
    if devices and devices[0].platform == "cpu":  # CPU devices share the host's RAM
        return per_device * len(devices), _host_bytes(), "of host memory for all CPU devices"
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    if not limits or any(limit is None for limit in limits):
        return per_device, None, ""
    return per_device, min(limits), "on each device"


def _host_bytes() -> int:
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return physical if limit == resource.RLIM_INFINITY else min(physical, limit)


def out_of_memory(graph, why: str) -> torch.OutOfMemoryError:
    """The error for a step of ``graph`` that cannot be allocated, ``why`` in words."""
    meta = _largest_value(graph)
    largest = ""
    if meta is not None:
        size = math.prod(meta.shape) * _itemsize(meta.dtype)
        largest = (f" Its largest value is a {str(meta.dtype).replace('torch.', '')} tensor of "
                   f"shape {tuple(meta.shape)} ({size / _GIB:.1f} GiB).")
    return torch.OutOfMemoryError(
        f"torchspmd: the step cannot be run: {why}.{largest} A tensor that is not sharded is replicated on "
        f"every device: shard large tensors with mark_sharding(t, mesh, spec) so that each "
        f"device holds only its part, or compute less in one step. Every value of this step "
        f"raises this error when read; new work runs normally.")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` (raised by XLA running a program) says memory ran out."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def _largest_value(graph):
    metas = [m for node in graph.nodes for m in node.sig.outputs if m is not None]
    if not metas:
        return None
    return max(metas, key=lambda m: math.prod(m.shape) * _itemsize(m.dtype))


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize

