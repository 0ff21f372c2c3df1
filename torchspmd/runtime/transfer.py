"""Host <-> device copies, bit-exact for every dtype, with byte counters."""

from __future__ import annotations

import functools

import jax
import ml_dtypes
import numpy as np
import torch

from torchspmd.jax_setup import devices
from torchspmd.lowering.xla_shardings import placement_for, replicated_over
from torchspmd.runtime.metrics import COUNTERS


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of CPU tensor ``t`` (bfloat16 through its bits, so nothing rounds)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor holding numpy array ``a`` (bfloat16 through its bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.array(a, copy=True).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def replicated() -> jax.sharding.Sharding:
    """Unsharded data's layout: replicated over every device (PyTorch/XLA's virtual device)."""
    return replicated_on(tuple(range(len(devices()))))


@functools.cache
def replicated_on(ids: tuple[int, ...]) -> jax.sharding.Sharding:
    """Replicated over the devices ``ids``, in that order (a mesh-free sharding: the
    sharded inputs of a program decide its output layouts)."""
    return replicated_over(tuple(devices()[i] for i in ids))


def upload(host: np.ndarray, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """Put ``host`` on the devices: each device receives only its own shard.

    Data annotated with an uneven sharding goes replicated on its devices (``placement_for``).
    """
    placed = replicated() if sharding is None else placement_for(sharding, host.shape)
    array = jax.device_put(host, placed)
    COUNTERS["bytes_to_device"] += sum(s.data.nbytes for s in array.addressable_shards)
    return array


def download(array: jax.Array) -> np.ndarray:
    """The full value of ``array`` on the host."""
    host = np.asarray(array)
    COUNTERS["bytes_to_host"] += host.nbytes
    return host
