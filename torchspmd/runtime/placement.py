"""Where a computation runs: all devices, or the one device set its inputs and annotations name.

Unsharded data lives replicated on every device. A computation that touches data or
sharding constraints on a sub-mesh runs on exactly that sub-mesh; its replicated inputs
lend the buffers they already have on those devices (no copy, nothing through the host).
Two different device sets in one computation are refused: which one the user meant is
theirs to say (reshard with ``mark_sharding`` or ``annotate_custom_sharding``).

Placement compares device *sets*. A program runs over its devices in increasing id
order; inputs laid out over another order of the same devices (a permuted mesh, or an
array XLA laid out for another program) are re-expressed over that order without a copy
(``xla_shardings.in_id_order``).
"""

from __future__ import annotations

import functools

import jax

from torchspmd.jax_setup import device_id, devices
from torchspmd.lowering.xla_shardings import in_id_order
from torchspmd.lowering import jax_private
from torchspmd.runtime import transfer
from torchspmd.runtime.aliases import note_shared


class MeshMismatchError(RuntimeError):
    """One computation mixes tensors on different device sets."""


@functools.lru_cache(maxsize=4096)
def device_ids(sharding: jax.sharding.Sharding) -> frozenset[int]:
    """The ids of the devices ``sharding`` spans.

    >>> sorted(device_ids(transfer.replicated_on((3, 1))))
    [1, 3]
    """
    return frozenset(device_id(d) for d in jax_private.device_assignment(sharding))


def target_devices(shardings: list, annotations: list = ()) -> tuple[int, ...] | None:
    """The device set a computation must run on (ids in increasing order), or ``None``
    when nothing in it names a device set other than all devices.

    ``shardings`` are those of its input arrays, ``annotations`` those of the sharding
    constraints inside it. Replicated data on all devices goes anywhere; an annotation
    over all devices, replicated or not, names them.
    """
    everything = frozenset(range(len(devices())))
    found: dict[frozenset, object] = {}
    sharded_everywhere = False
    for sharding in [*shardings, *annotations]:
        ids = device_ids(sharding)
        if ids != everything:
            found.setdefault(ids, sharding)
        elif not sharding.is_fully_replicated or sharding in annotations:
            sharded_everywhere = True
    if len(found) > 1:
        a, b = [_shown_order(s) for s in list(found.values())[:2]]
        raise MeshMismatchError(
            f"torchspmd: one computation uses tensors on devices {a} and on devices {b}; "
            f"a computation runs on one set of devices. Move one tensor onto the other's "
            f"mesh first: clear_sharding(t), then mark_sharding(t, mesh, spec) (its data "
            f"moves device to device; sync() a pending result before moving it).")
    if found and sharded_everywhere:
        ids = _shown_order(next(iter(found.values())))
        raise MeshMismatchError(
            f"torchspmd: one computation uses tensors sharded (or annotated) over all "
            f"{len(everything)} "
            f"devices and tensors on the sub-mesh {ids}. Move one tensor onto the "
            f"other's mesh first: clear_sharding(t), then mark_sharding(t, mesh, spec).")
    return tuple(sorted(next(iter(found)))) if found else None


def _shown_order(sharding: jax.sharding.Sharding) -> list[int]:
    """The device ids of ``sharding`` in its mesh's order (as the user wrote the mesh)."""
    holders = jax_private.device_assignment(sharding)
    logical = jax_private.logical_device_ids(sharding)
    if logical is not None:
        holders = [holders[i] for i in logical]
    return [device_id(d) for d in holders]


def replicated_on(ids: tuple[int, ...]) -> jax.sharding.Sharding:
    """Replicated over the devices ``ids`` (in that order)."""
    return transfer.replicated_on(tuple(ids))


# id(sharding) -> (sharding, ndim, ids): arrays of that layout and rank enter a program
# on ``ids`` as they are. A program's outputs share a few sharding objects step after
# step, so a training loop skips hashing and comparing shardings (Python code in JAX)
# for every input of every sync. The entry holds its sharding: its id stays its own.
_AS_IS: dict[int, tuple] = {}
_AS_IS_LIMIT = 1024


def place(array: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    """``array`` as an input of a program on the devices ``ids`` (increasing ids).

    Arrays over those devices are re-expressed in id order (no copy); replicated arrays
    over more devices lend their buffers on ``ids``.
    """
    sharding = array.sharding
    known = _AS_IS.get(id(sharding))
    if (known is not None and known[0] is sharding and known[1] == array.ndim
            and known[2] == ids):
        return array
    if device_ids(sharding) != frozenset(ids):
        return restrict(array, ids)
    placed = in_id_order_array(array)
    if placed is array:
        if len(_AS_IS) >= _AS_IS_LIMIT:
            _AS_IS.clear()
        _AS_IS[id(sharding)] = (sharding, array.ndim, tuple(ids))
    return placed


def in_id_order_array(array: jax.Array) -> jax.Array:
    """``array`` laid out as before, its sharding over its devices in id order (no copy)."""
    sharding = in_id_order(array.sharding, array.ndim)
    # ``in_id_order`` is cached: it returns the first of equal shardings it saw, so an
    # array already in id order usually has an equal sharding, not the same object.
    if sharding is array.sharding or sharding == array.sharding:
        return array
    return _relabel(array, sharding)


def _relabel(array: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """The buffers of ``array`` under ``sharding``, which gives each device the same block."""
    by_device = {s.device: s.data for s in array.addressable_shards}
    result = jax.make_array_from_single_device_arrays(
        array.shape, sharding, [by_device[d] for d in jax_private.addressable_devices(sharding)])
    note_shared(array, result, check=False)
    return result


def restrict(array: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    """``array`` (replicated) as an array on just the devices ``ids``.

    Uses the buffers ``array`` already holds there; copies device to device only for
    devices it does not cover.
    """
    if device_ids(array.sharding) == frozenset(ids) and array.sharding.is_fully_replicated:
        return in_id_order_array(array)
    if not array.sharding.is_fully_replicated:
        raise MeshMismatchError(
            f"torchspmd: a tensor sharded over devices {sorted(device_ids(array.sharding))} "
            f"cannot join a computation on devices {list(ids)}; reshard it onto that mesh "
            f"first (clear_sharding(t), then mark_sharding(t, mesh, spec)).")
    target = replicated_on(ids)
    if target.device_set <= array.sharding.device_set:
        return transfer.restricted(array, jax_private.device_assignment(target))
    return transfer.reshard(array, target)


def reshard(array: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """``array``'s data laid out as ``sharding``, moved device to device.

    Any device order on either side: both are put in id order first, where JAX's own
    reshard is exact (across two orders it drops logical device ids). The result's
    sharding is ``sharding`` in id order, ready for any program on those devices.
    """
    target = in_id_order(sharding, array.ndim)
    if array.sharding.is_equivalent_to(target, array.ndim):
        return array
    return transfer.reshard(in_id_order_array(array), target)
