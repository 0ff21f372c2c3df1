"""Array regions: which box of a global array each process's devices hold, write and load.

A checkpoint writes each distinct region of an array once, and loading builds an array
from host data, each process supplying only its own devices' regions.
"""

from __future__ import annotations

import jax
import numpy as np

from torchspmd.jax_setup import device_id
from torchspmd.lowering import jax_private
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.transfer import addressable_buffers

Region = tuple[tuple[int, int], ...]
"""A box of a global array: one ``(start, stop)`` per dim."""


def region(index: tuple, shape: tuple[int, ...]) -> Region:
    """JAX's per-device index (slices, maybe open) as a :data:`Region` of ``shape``.

    >>> region((slice(None), slice(2, 4)), (3, 8))
    ((0, 3), (2, 4))
    """
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def owned_shards(array: jax.Array) -> list[tuple[Region, jax.Array]]:
    """The distinct shards of ``array`` that this process owns, with their buffers.

    Each distinct region of the array (replicas share one) is owned by the device with
    the lowest global id holding it, so across all processes every region is listed
    exactly once: what a checkpoint writes.
    """
    shape = array.shape
    owners: dict[Region, jax.Device] = {}
    for device, index in sorted(array.sharding.devices_indices_map(shape).items(),
                                key=lambda item: device_id(item[0])):
        owners.setdefault(region(index, shape), device)
    buffers = addressable_buffers(array)
    return [(box, buffers[device]) for box, device in owners.items() if device in buffers]


def local_regions(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> list[Region]:
    """The distinct regions this process's devices hold under ``sharding``."""
    boxes = sharding.addressable_devices_indices_map(shape).values()
    return list(dict.fromkeys(region(index, shape) for index in boxes))


def assemble(shape: tuple[int, ...], sharding: jax.sharding.Sharding, dtype,
             data_for_device) -> jax.Array:
    """A ``shape`` array laid out as ``sharding`` from host data, each device its own.

    ``data_for_device(device, region)`` returns the host data of one of this process's
    devices; other processes pass their own devices' data.
    """
    by_device = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        host = np.asarray(data_for_device(device, region(index, shape)), dtype=dtype)
        by_device[device] = jax.device_put(host, device)
        COUNTERS["bytes_to_device"] += host.nbytes
    return jax.make_array_from_single_device_arrays(
        shape, sharding, [by_device[d] for d in jax_private.addressable_devices(sharding)],
        dtype=dtype)


def _crop_to(shape: tuple[int, ...]):
    return lambda x: x[tuple(slice(0, n) for n in shape)]


def cropped(array: jax.Array, shape: tuple[int, ...],
            sharding: jax.sharding.Sharding) -> jax.Array:
    """The leading ``shape`` corner of ``array``, laid out as ``sharding`` (one program)."""
    return jax.jit(_crop_to(tuple(shape)), out_shardings=sharding)(array)
