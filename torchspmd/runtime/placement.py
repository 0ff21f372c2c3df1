"""Where a graph runs: all devices, or the one sub-mesh its inputs and constraints name.

Unsharded data lives replicated on every device. A graph that touches data or sharding
constraints on a sub-mesh runs on exactly that sub-mesh; its replicated inputs lend the
buffers they already have on those devices (no copy, nothing through the host).
Two different device sets in one graph are refused: which one the user meant is theirs
to say (reshard with ``mark_sharding`` or ``annotate_custom_sharding``).
"""

from __future__ import annotations

import jax
import numpy as np

from torchspmd.jax_setup import device_id, devices
from torchspmd.runtime import transfer


class MeshMismatchError(RuntimeError):
    """One computation mixes tensors on different device sets."""


def device_ids(sharding: jax.sharding.Sharding) -> tuple[int, ...]:
    """The sharding's devices in mesh order (a ``NamedSharding``), else in id order."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and hasattr(mesh, "devices"):
        return tuple(device_id(d) for d in np.asarray(mesh.devices).flat)
    return tuple(device_id(d) for d in sharding._device_assignment)


def target_devices(arrays: list[jax.Array], constraints: list) -> tuple[int, ...] | None:
    """The sub-mesh a graph must run on, or ``None`` to run where its inputs are.

    ``constraints`` are the shardings the graph's annotations ask for.
    """
    everything = frozenset(range(len(devices())))
    found: dict[frozenset, tuple[int, ...]] = {}
    sharded_everywhere = False
    for sharding in [a.sharding for a in arrays] + list(constraints):
        ids = device_ids(sharding)
        if frozenset(ids) != everything:
            found.setdefault(frozenset(ids), ids)
        elif not sharding.is_fully_replicated:
            sharded_everywhere = True
    if len(found) > 1:
        a, b = list(found.values())[:2]
        raise MeshMismatchError(
            f"torchspmd: one computation uses tensors on devices {list(a)} and on devices "
            f"{list(b)}; a computation runs on one set of devices. Move one tensor onto the "
            f"other's mesh first: clear_sharding(t), then mark_sharding(t, mesh, spec) (its "
            f"data moves device to device; sync() a pending result before moving it).")
    if found and sharded_everywhere:
        (ids,) = found.values()
        raise MeshMismatchError(
            f"torchspmd: one computation uses tensors sharded over all {len(everything)} "
            f"devices and tensors on the sub-mesh {list(ids)}. Move one tensor onto the "
            f"other's mesh first: clear_sharding(t), then mark_sharding(t, mesh, spec).")
    return next(iter(found.values()), None)


def replicated_on(ids: tuple[int, ...]) -> jax.sharding.Sharding:
    """Replicated over the devices ``ids`` (in that order)."""
    return transfer.replicated_on(tuple(ids))


def restrict(array: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    """``array`` (replicated) as an array on just the devices ``ids``.

    Uses the buffers ``array`` already holds there; copies device to device only for
    devices it does not cover.
    """
    if frozenset(device_ids(array.sharding)) == frozenset(ids) and array.sharding.is_fully_replicated:
        return array
    if not array.sharding.is_fully_replicated:
        raise MeshMismatchError(
            f"torchspmd: a tensor sharded as {array.sharding} cannot join a computation on "
            f"devices {list(ids)}; reshard it onto that mesh first (mark_sharding).")
    target = replicated_on(ids)
    if target.device_set <= array.sharding.device_set:
        return transfer.restricted(array, target._device_assignment)
    return transfer.reshard(array, target)
