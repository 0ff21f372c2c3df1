"""Every use of JAX's private names, each with a fallback to public JAX.

JAX's public API lacks a few things torchspmd needs on its hot paths (a sharding's device
order, a shard upload without per-call checks) or at all (a mesh-free replicated sharding,
Shardy's logical device ids, the tiles of a sharding). They are read here and nowhere
else, so a JAX upgrade touches this one file. Each function first takes JAX's private
route (a ``_private_*`` function); where this JAX lays its internals out differently (a name gone, a signature
changed) it falls back to public API, which gives the same result (tested one by one in
``tests/lowering/test_jax_private.py``), slower or, where noted, less precisely.
``shard_alike`` goes the other way round: public JAX's up to 0.10, rebuilt from JAX's
internals where 0.11 removed it.

Checked against JAX 0.10.2 and 0.11.x (``jax/_src/sharding.py``, ``named_sharding.py``,
``sharding_impls.py``, ``interpreters/pxla.py``, ``core.py``, ``xla_bridge.py``,
``distributed.py``). This module imports nothing from torchspmd, so any layer may use it.

Example::

    from torchspmd.lowering import jax_private
    jax_private.device_assignment(NamedSharding(mesh, P("x")))   # (dev0, dev1, ...)
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["device_assignment", "addressable_devices", "logical_device_ids",
           "named_sharding", "replicated_over", "TileLayout", "tile_layout", "put_shards",
           "backends_started", "DistributedArguments", "distributed_arguments", "shard_alike"]

_FALLBACK_ERRORS = (AttributeError, ImportError, TypeError)


# -- device order ------------------------------------------------------------------

def device_assignment(sharding: jax.sharding.Sharding) -> tuple:
    """The devices of ``sharding`` in the order its program numbers them.

    >>> device_assignment(NamedSharding(jax.sharding.Mesh(jax.devices()[:2], ("x",)), P()))
    (CpuDevice(id=0), CpuDevice(id=1))
    """
    try:
        return _private_device_assignment(sharding)
    except _FALLBACK_ERRORS:
        return _public_device_assignment(sharding)


def _private_device_assignment(sharding) -> tuple:
    return tuple(sharding._device_assignment)


def _public_device_assignment(sharding: jax.sharding.Sharding) -> tuple:
    # A named sharding numbers its mesh's devices in mesh order; other kinds are read in
    # id order (JAX's own order for every sharding torchspmd makes of them).
    if isinstance(sharding, NamedSharding):
        return tuple(sharding.mesh.devices.flat)
    return tuple(sorted(sharding.device_set, key=lambda d: d.id))


def addressable_devices(sharding: jax.sharding.Sharding) -> list:
    """This process's devices of ``sharding``, in :func:`device_assignment` order.

    >>> addressable_devices(transfer.replicated())[:2]   # doctest: +SKIP
    [CpuDevice(id=0), CpuDevice(id=1)]
    """
    try:
        return _private_addressable_devices(sharding)
    except _FALLBACK_ERRORS:
        here = jax.process_index()
        return [d for d in _public_device_assignment(sharding) if d.process_index == here]


def _private_addressable_devices(sharding) -> list:
    return list(sharding._addressable_device_assignment)


def logical_device_ids(sharding: jax.sharding.Sharding) -> tuple[int, ...] | None:
    """Shardy's logical device ids of a named sharding (positions into its device
    assignment, in mesh order), or ``None`` for a plain one or another kind.

    >>> logical_device_ids(NamedSharding(mesh, P("x")))   # doctest: +SKIP
    None
    """
    try:
        return _private_logical_device_ids(sharding)
    except _FALLBACK_ERRORS:  # no such ids in this JAX: a named sharding is in mesh order
        return None


def _private_logical_device_ids(sharding) -> tuple[int, ...] | None:
    return sharding._logical_device_ids if isinstance(sharding, NamedSharding) else None


def named_sharding(mesh: jax.sharding.Mesh, spec: PartitionSpec, memory_kind: str | None,
                   ids: tuple[int, ...] | None) -> NamedSharding:
    """``NamedSharding(mesh, spec)`` whose blocks are held by ``mesh``'s devices in the
    order ``ids`` (Shardy's logical device ids; ``None`` for mesh order).

    The fallback, where JAX has no such ids, puts the devices on the mesh in that order
    instead: each device holds the same block, but the program's device order is the
    holders' order, not the ids' (programs mixing such shardings then need a reshard).

    >>> named_sharding(Mesh(devs[:2], ("x",)), P("x"), None, (1, 0))   # doctest: +SKIP
    NamedSharding(mesh=Mesh('x': 2), spec=P('x',), logical_device_ids=(1, 0))
    """
    if ids is None:
        return NamedSharding(mesh, spec, memory_kind=memory_kind)
    try:
        return _private_named_sharding(mesh, spec, memory_kind, ids)
    except _FALLBACK_ERRORS:
        return _public_named_sharding(mesh, spec, memory_kind, ids)


def _private_named_sharding(mesh, spec, memory_kind, ids) -> NamedSharding:
    return NamedSharding(mesh, spec, memory_kind=memory_kind, _logical_device_ids=tuple(ids))


def _public_named_sharding(mesh, spec, memory_kind, ids) -> NamedSharding:
    flat = list(mesh.devices.flat)
    holders = np.empty(len(flat), dtype=object)
    holders[:] = [flat[i] for i in ids]
    grid = jax.sharding.Mesh(holders.reshape(mesh.devices.shape), mesh.axis_names,
                             axis_types=mesh.axis_types)
    return NamedSharding(grid, spec, memory_kind=memory_kind)


def replicated_over(devices: tuple) -> jax.sharding.Sharding:
    """A mesh-free sharding replicated over ``devices``, in that order.

    Not a ``NamedSharding``: ``jit`` lays its outputs out on the mesh of the first input
    with a named sharding, and a 1-d mesh cannot express a 2-d mesh's layouts. The
    fallback is such a 1-d named sharding, which is right wherever no program mixes it
    with another mesh's shardings.

    >>> replicated_over(tuple(jax.devices()[:2])).is_fully_replicated
    True
    """
    try:
        return _private_replicated_over(tuple(devices))
    except _FALLBACK_ERRORS:
        return _public_replicated_over(devices)


def _private_replicated_over(devices: tuple) -> jax.sharding.Sharding:
    from jax._src.sharding_impls import GSPMDSharding

    return GSPMDSharding.get_replicated(devices)


def _public_replicated_over(devices: tuple) -> jax.sharding.Sharding:
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    return NamedSharding(jax.sharding.Mesh(grid, ("_replica",)), PartitionSpec())


# -- tiles ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TileLayout:
    """How a sharding tiles a rank-``ndim`` array, as XLA's ``HloSharding`` says.

    ``dims``: tiles along each array dim, then (if ``replicate_last`` or ``subgroups``)
    the size of the replication groups; ``devices``: the tile grid, row-major, as
    positions into :func:`device_assignment`; ``iota``: whether ``devices`` is an iota
    (possibly transposed; the public fallback only recognises ``0, 1, ...``).
    """

    replicated: bool
    manual: bool
    maximal: bool
    dims: tuple[int, ...]
    devices: tuple[int, ...]
    replicate_last: bool
    subgroups: tuple[str, ...]
    iota: bool


def tile_layout(sharding: jax.sharding.Sharding, ndim: int) -> TileLayout:
    """The tiling of a rank-``ndim`` array laid out as ``sharding``.

    >>> tile_layout(NamedSharding(Mesh(devs[:2], ("x",)), P("x")), 1).dims   # doctest: +SKIP
    (2,)
    """
    try:
        return _private_tile_layout(sharding, ndim)
    except _FALLBACK_ERRORS:
        return _public_tile_layout(sharding, ndim)


def _private_tile_layout(sharding: jax.sharding.Sharding, ndim: int) -> TileLayout:
    hlo = sharding._to_xla_hlo_sharding(ndim)
    if hlo.is_replicated() or hlo.is_manual():
        return TileLayout(hlo.is_replicated(), hlo.is_manual(), False, (), (), False, (), False)
    subgroups = tuple(t.name.lower() for t in hlo.subgroup_types())
    return TileLayout(False, False, hlo.is_maximal(), tuple(hlo.tile_assignment_dimensions()),
                      tuple(hlo.tile_assignment_devices()), hlo.replicate_on_last_tile_dim(),
                      subgroups, hlo.is_tile_assignment_iota())


def _public_tile_layout(sharding: jax.sharding.Sharding, ndim: int) -> TileLayout:
    """From ``devices_indices_map`` of a shape every tile count divides (the device count
    in each dim: tile counts multiply to at most the device count and divide it)."""
    if sharding.is_fully_replicated:
        return TileLayout(True, False, False, (), (), False, (), False)
    order = _public_device_assignment(sharding)
    n = len(order)
    indices = sharding.devices_indices_map((n,) * ndim)
    starts = {d: tuple((s.start or 0) for s in index) for d, index in indices.items()}
    sizes = {d: tuple((s.stop if s.stop is not None else n) - (s.start or 0) for s in index)
             for d, index in indices.items()}
    some = next(iter(sizes.values()))
    tiles = tuple(n // size for size in some)
    groups: dict[tuple, list[int]] = {}
    for position, device in enumerate(order):
        tile = tuple(start // size for start, size in zip(starts[device], sizes[device]))
        groups.setdefault(tile, []).append(position)
    per_tile = n // int(np.prod(tiles))
    grid = np.empty(tiles + ((per_tile,) if per_tile > 1 else ()), dtype=object)
    for tile, positions in groups.items():
        grid[tile] = positions if per_tile > 1 else positions[0]
    devices = tuple(int(p) for p in np.asarray(grid.tolist()).flat)
    dims = tuple(grid.shape)
    return TileLayout(False, False, False, dims, devices, per_tile > 1, (),
                      devices == tuple(range(n)))


# -- uploads -------------------------------------------------------------------------

def put_shards(shape: tuple[int, ...], dtype, sharding: jax.sharding.Sharding,
               shards: list, devices: list) -> jax.Array:
    """An array of ``shape`` laid out as ``sharding`` from one host array per device of
    ``devices`` (this process's devices of the sharding, in its order).

    Private route: the batched put that ``make_array_from_callback`` and ``device_put``
    end in, less their per-call checks (~10-50 us of host time per array, paid every step
    by a batch or a learning-rate vector). Public route: one ``device_put`` per shard.

    >>> put_shards((2,), np.float32, replicated, [host, host], devs[:2])   # doctest: +SKIP
    """
    try:
        return _private_put_shards(shape, dtype, sharding, shards, devices)
    except _FALLBACK_ERRORS:
        return _public_put_shards(shape, dtype, sharding, shards, devices)


def _private_put_shards(shape, dtype, sharding, shards, devices) -> jax.Array:
    put, shaped_array, with_sharding = _batched_put_internals()  # ImportError if gone
    aval = with_sharding(shaped_array(tuple(shape), np.dtype(dtype)), sharding)
    return put(aval, sharding, shards, devices)


def _public_put_shards(shape, dtype, sharding, shards, devices) -> jax.Array:
    buffers = [jax.device_put(np.asarray(s, dtype=dtype), d) for s, d in zip(shards, devices)]
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding, buffers, dtype=dtype)


@functools.cache
def _batched_put_internals() -> tuple:
    from jax._src.core import ShapedArray, update_aval_with_sharding
    from jax._src.interpreters.pxla import batched_device_put

    return batched_device_put, ShapedArray, update_aval_with_sharding


# -- layouts alike -------------------------------------------------------------------

def shard_alike(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(x, y)`` unchanged, laid out alike by the partitioner (inside ``jit``).

    Public JAX had this as ``jax.experimental.shard_alike`` up to 0.10 and removed it in
    0.11; there, the same lowering is built here from JAX's internals: both values join
    one Shardy sharding group (or, with Shardy off, GSPMD's "shard as" group).
    """
    try:
        from jax.experimental.shard_alike import shard_alike as public
    except ImportError:
        return tuple(_private_shard_alike_primitive().bind(x, y))
    return public(x, y)


@functools.cache
def _private_shard_alike_primitive():
    import itertools

    from jax._src import core, dispatch
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import dialects

    primitive = core.Primitive("torchspmd_shard_alike")
    primitive.multiple_results = True
    primitive.def_impl(functools.partial(dispatch.apply_primitive, primitive))
    primitive.def_abstract_eval(lambda x, y: (x, y))
    groups = itertools.count()

    def lower(ctx, x, y):
        group = next(groups)
        if jax.config.jax_use_shardy_partitioner:
            dialects.sdy.sharding_group(x, group)
            dialects.sdy.sharding_group(y, group)
            return [x, y]
        unknown = xla_client.OpSharding()
        unknown.type = xla_client.OpSharding.Type.UNKNOWN
        unknown.is_shard_group = True
        unknown.shard_group_id = group
        unknown.shard_group_type = xla_client.OpSharding.ShardGroupType.AS
        return [mlir.wrap_with_sharding_op(ctx, v, aval, unknown, has_side_effect=True)
                for v, aval in zip((x, y), ctx.avals_out)]

    mlir.register_lowering(primitive, lower)
    return primitive


# -- processes -----------------------------------------------------------------------

def backends_started() -> bool:
    """Whether JAX's backends (its devices) have started in this process.

    The fallback answers ``False``: ``jax.distributed.initialize`` then raises JAX's own
    error if they have.

    >>> backends_started()   # doctest: +SKIP
    True
    """
    try:
        return _private_backends_started()
    except _FALLBACK_ERRORS:
        return False


def _private_backends_started() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


@dataclasses.dataclass(frozen=True)
class DistributedArguments:
    """What ``jax.distributed.initialize`` was started with (``None`` where unknown)."""

    coordinator_address: str | None
    num_processes: int
    process_id: int


def distributed_arguments() -> DistributedArguments:
    """The arguments of the multi-process runtime this process runs under (one process,
    coordinator ``None``, if it joined none).

    The fallback reads the process count and index from JAX's public API and the
    coordinator from ``JAX_COORDINATOR_ADDRESS`` (JAX's own variable), if set.

    >>> distributed_arguments().num_processes   # doctest: +SKIP
    1
    """
    try:
        return _private_distributed_arguments()
    except _FALLBACK_ERRORS:
        return _public_distributed_arguments()


def _private_distributed_arguments() -> DistributedArguments:
    from jax._src.distributed import global_state  # jax keeps the arguments it started with

    return DistributedArguments(global_state.coordinator_address,
                                global_state.num_processes or 1, global_state.process_id or 0)


def _public_distributed_arguments() -> DistributedArguments:
    if not jax.distributed.is_initialized():
        return DistributedArguments(None, 1, 0)
    return DistributedArguments(os.environ.get("JAX_COORDINATOR_ADDRESS"),
                                jax.process_count(), jax.process_index())
