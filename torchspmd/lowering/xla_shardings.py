"""The two rules that decide which sharding XLA is given for an annotation or an array.

**Uneven shardings.** A sharding whose tile counts do not divide a dim (3 rows over 2
devices) is kept as the tensor's *annotation* (``get_sharding``, ``sharding_spec`` and
``local_shards`` show it, with padded shards, as PyTorch/XLA does), but XLA only ever
sees such a value *replicated over the sharding's devices*: JAX cannot hold unevenly
tiled arrays, and XLA's SPMD partitioner miscompiles some ops (dynamic-update-slice)
under an uneven constraint. :func:`placement_for` is that rule; uploads, reshards,
constraints in the graph and in-place re-annotations all go through it.

**Device order.** One XLA program has one device assignment, while a mesh may list its
devices in any order (``Mesh([1, 0, 2, ...])``, ``HybridMesh``, TPU topology order), and
two meshes over the same devices may order them differently. Every program therefore
runs over its devices in increasing id order, and XLA is only ever given layouts whose
tile assignment is an iota over that order (:func:`in_id_order`): a permuted mesh's
layout goes to XLA as the same spec over the mesh's devices in id order, and a dim split
over several mesh axes lists them in mesh order (:func:`axes_in_mesh_order`). XLA miscompiles
a tiled operand whose tile assignment is any other permutation of the program's devices
(a wrong gradient of ``x @ w.T``, Shardy and GSPMD alike;
``tests/lowering/test_xla_permuted_tiles.py`` keeps the plain-JAX repro), so expressing
a permuted layout over id order with Shardy's logical device ids is not an option.

The data of a tensor annotated on a permuted mesh is therefore *stored* as if its mesh
were in id order: its annotation (``get_sharding``, ``sharding_spec``, ``local_shards``
and their device ids) keeps the user's mesh, but device ``mesh.device_ids[i]`` need not
hold the block of mesh position ``i`` (``local_shards`` cuts such shards from the whole
value). Uploads and reshards place data in id order directly, so a permuted mesh costs a
move only for arrays laid out elsewhere (by JAX or ``call_jax``). Placement compares
device *sets*; annotations keep their order.

Example::

    placement_for(NamedSharding(mesh_of_2, P("x")), (3,))     # replicated on mesh_of_2
    in_id_order(NamedSharding(Mesh([1, 0]), P("x")), 1)       # P("x") over devices 0, 1
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

# The one module that reads JAX's private names (it imports nothing from torchspmd).
from torchspmd.lowering import jax_private

__all__ = ["is_divisible", "replicated", "replicated_over", "placement_for", "constraint_for",
           "in_id_order", "axes_in_mesh_order", "mesh_in_id_order", "holds_same_blocks"]


def is_divisible(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> bool:
    """Whether every dim of ``shape`` divides evenly into ``sharding``'s tiles.

    >>> is_divisible(NamedSharding(mesh_of_2, PartitionSpec("x")), (3,))  # doctest: +SKIP
    False
    """
    try:
        sharding.shard_shape(tuple(shape))
        return True
    except ValueError:  # jax's IndivisibleError
        return False


def replicated(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """Replicated over ``sharding``'s devices, in its order (its mesh kept, if named).

    >>> replicated(NamedSharding(mesh_of_2, PartitionSpec("x"))).spec  # doctest: +SKIP
    PartitionSpec()
    """
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(), memory_kind=sharding.memory_kind)
    return replicated_over(jax_private.device_assignment(sharding))


def placement_for(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> jax.sharding.Sharding:
    """Where data annotated with ``sharding`` lives: there, or replicated if it is uneven.

    >>> placement_for(NamedSharding(mesh_of_2, PartitionSpec("x")), (3,)).spec  # doctest: +SKIP
    PartitionSpec()
    """
    return sharding if is_divisible(sharding, shape) else replicated(sharding)


def constraint_for(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> jax.sharding.Sharding:
    """The sharding constraint XLA is given for a ``shape`` value annotated ``sharding``.

    >>> constraint_for(NamedSharding(mesh_of_2, PartitionSpec("x")), (3,))  # doctest: +SKIP
    GSPMDSharding({replicated})
    """
    return in_id_order(placement_for(sharding, shape), len(shape))


@functools.lru_cache(maxsize=4096)
def in_id_order(sharding: jax.sharding.Sharding, ndim: int) -> jax.sharding.Sharding:
    """The layout XLA is given for ``sharding``: over its devices in increasing id order,
    its tile assignment an iota over them (``sharding`` itself if it is one already).

    A permuted mesh's layout becomes the same spec over the mesh in id order, and a layout
    XLA chose with another tile order (a ``GSPMDSharding``) the same tiling over the devices
    in id order: devices may then hold other blocks (:func:`holds_same_blocks` says whether
    the data must move). Never Shardy's logical device ids: XLA miscompiles them (see the
    module docstring).

    >>> in_id_order(NamedSharding(Mesh([1, 0]), PartitionSpec("x")), 1)  # doctest: +SKIP
    NamedSharding(mesh=Mesh('x': 2), spec=P('x',))           # over devices 0, 1
    """
    devices = jax_private.device_assignment(sharding)
    logical = jax_private.logical_device_ids(sharding)
    ordered = tuple(sorted(devices, key=lambda d: d.id))
    if sharding.is_fully_replicated:
        plain = isinstance(sharding, NamedSharding) and logical is None
        if devices == ordered and (plain or not isinstance(sharding, NamedSharding)):
            return sharding
        return replicated_over(ordered)
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, jax.sharding.Mesh):
        spec = axes_in_mesh_order(sharding.spec, sharding.mesh.axis_names)
        if devices == ordered and logical is None and spec is sharding.spec:
            return sharding
        return NamedSharding(mesh_in_id_order(sharding.mesh), spec,
                             memory_kind=sharding.memory_kind)
    return _from_hlo(sharding, ndim, devices, ordered)


def axes_in_mesh_order(spec: PartitionSpec, names: tuple) -> PartitionSpec:
    """``spec`` with each dim split over several mesh axes listing them in mesh order
    (``spec`` itself if every dim does already).

    ``P(("c", "a"), "b")`` on a ``("a", "b", "c")`` mesh tiles dim 0 minor axis first:
    XLA computes dots into that layout wrongly (the plain-JAX repro is kept in
    ``tests/lowering/test_xla_axes_out_of_mesh_order.py``). ``P(("a", "c"), "b")`` is the
    same tiling with the blocks on other devices.

    >>> axes_in_mesh_order(PartitionSpec(("c", "a"), "b"), ("a", "b", "c"))
    PartitionSpec(('a', 'c'), 'b')
    """
    entries = list(spec)
    ordered = [tuple(sorted(e, key=names.index)) if isinstance(e, tuple) else e for e in entries]
    return spec if ordered == entries else PartitionSpec(*ordered)


@functools.lru_cache(maxsize=4096)
def holds_same_blocks(a: jax.sharding.Sharding, b: jax.sharding.Sharding,
                      shape: tuple[int, ...]) -> bool:
    """Whether every device holds the same block of a ``shape`` array under ``a`` and ``b``
    (then one's buffers serve as the other's without a copy).

    >>> holds_same_blocks(NamedSharding(Mesh([1, 0]), P("x")),
    ...                   NamedSharding(Mesh([0, 1]), P("x")), (2,))  # doctest: +SKIP
    False
    """
    return a.devices_indices_map(tuple(shape)) == b.devices_indices_map(tuple(shape))


def mesh_in_id_order(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """``mesh``'s shape and axes over its devices in id order (a ``shard_map`` body over it
    computes the same values; which device computes which block may differ).

    >>> mesh_in_id_order(Mesh([1, 0])).devices  # doctest: +SKIP
    array([CpuDevice(id=0), CpuDevice(id=1)], dtype=object)
    """
    flat = tuple(mesh.devices.flat)
    ordered = tuple(sorted(flat, key=lambda d: d.id))
    if flat == ordered:
        return mesh
    return jax.sharding.Mesh(_device_grid(ordered, mesh.axis_sizes), mesh.axis_names,
                             axis_types=mesh.axis_types)


def _from_hlo(sharding, ndim: int, devices: tuple, ordered: tuple):
    """Any tiled sharding's tiling as a ``NamedSharding`` over ``ordered``, tiles in device
    order (an iota): one mesh axis per tile dim."""
    tiles = jax_private.tile_layout(sharding, ndim)
    if devices == ordered and not isinstance(sharding, NamedSharding) and tiles.iota:
        return sharding  # Shardy converts iota tile assignments itself
    dims = tiles.dims
    if len(dims) not in (ndim, ndim + 1) or (len(dims) > ndim and not _replicated_last(tiles)):
        raise NotImplementedError(f"torchspmd: cannot re-express the sharding {sharding} over "
                                  "the devices in id order (it is neither tiled nor partially "
                                  "replicated); please report this with the code that made it")
    names = tuple(f"_tile{i}" for i in range(len(dims)))
    grid = jax.sharding.Mesh(_device_grid(ordered, dims), names)
    spec = PartitionSpec(*[names[i] if dims[i] > 1 else None for i in range(ndim)])
    return NamedSharding(grid, spec, memory_kind=sharding.memory_kind)


def _replicated_last(tiles: jax_private.TileLayout) -> bool:
    return tiles.replicate_last or tiles.subgroups == ("replicated",)


def _device_grid(devices: tuple, shape: tuple[int, ...]) -> np.ndarray:
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    return grid.reshape(shape)


@functools.cache
def replicated_over(devices: tuple) -> jax.sharding.Sharding:
    """Replicated over the JAX ``devices``, in that order.

    >>> replicated_over(tuple(jax.devices()[:2])).is_fully_replicated
    True
    """
    return jax_private.replicated_over(tuple(devices))
