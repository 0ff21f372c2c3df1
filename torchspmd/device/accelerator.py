"""``torch.accelerator``'s device-agnostic calls, answered for the spmd device.

Code written for any accelerator (timing loops, training libraries) calls
``torch.accelerator.synchronize()``, ``empty_cache()`` or ``memory_allocated()``. PyTorch
answers them through C++ hooks (a stream-syncing device guard, a caching allocator) that a
device implemented in Python cannot register: for spmd they raised PyTorch's own errors
("Backend doesn't support synchronizing all streams", an INTERNAL ASSERT naming its
allocator). While spmd is the current accelerator, these functions are wrapped:

- ``synchronize()`` waits for every device's pending work (``wait_device_ops``);
- ``empty_cache()`` does nothing: XLA frees a buffer when its last array dies, and no
  cache of freed blocks is kept here;
- the memory statistics raise a ``NotImplementedError`` naming where JAX's are.

Any other device (an explicit ``"cuda"``, a CUDA current accelerator) goes to PyTorch's
own function unchanged.

Example::

    torch.accelerator.synchronize()      # with spmd tensors: waits for their programs
"""

from __future__ import annotations

import functools

import torch

from torchspmd.runtime.in_flight import wait_device_ops

_MEMORY = ("memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "get_memory_info")


def _for_spmd(device) -> bool:
    """Whether ``device`` (None or an index: the current accelerator's) is spmd."""
    if device is None or isinstance(device, int):
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == "spmd"
    return torch.device(device).type == "spmd"


def _wrapped(name: str, on_spmd):
    original = getattr(torch.accelerator, name)
    if getattr(original, "_torchspmd", False):
        return original

    @functools.wraps(original)
    def call(*args):  # (device=None, /), or no argument (empty_cache)
        if _for_spmd(args[0] if args else None):
            return on_spmd(name)
        return original(*args)

    call._torchspmd = True
    return call


def _synchronize(name: str) -> None:
    wait_device_ops()


def _nothing(name: str) -> None:
    return None


def _no_statistics(name: str):
    raise NotImplementedError(
        f"torchspmd: torch.accelerator.{name}() has no allocator to ask on the spmd device "
        "(a device implemented in Python cannot register one with PyTorch). JAX keeps "
        "per-device statistics: [d.memory_stats() for d in jax.local_devices()] (None on "
        "the CPU backend); a compiled step's memory_analysis() gives what XLA planned.")


def install() -> None:
    """Wrap ``torch.accelerator``'s functions (idempotent)."""
    torch.accelerator.synchronize = _wrapped("synchronize", _synchronize)
    torch.accelerator.empty_cache = _wrapped("empty_cache", _nothing)
    for name in _MEMORY:
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, _wrapped(name, _no_statistics))
