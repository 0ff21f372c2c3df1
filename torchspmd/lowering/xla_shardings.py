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
runs over its devices in increasing id order, and every sharding it sees is re-expressed
over that order by :func:`in_id_order`, keeping which device holds which block (the
mesh's order goes into Shardy's logical device ids). Re-expressing an array moves no
data. Placement compares device *sets*; layouts keep their order.

Example::

    placement_for(NamedSharding(mesh_of_2, P("x")), (3,))     # replicated on mesh_of_2
    in_id_order(NamedSharding(Mesh([1, 0]), P("x")), 1)       # devices 0, 1; same blocks
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

# The one module that reads JAX's private names (it imports nothing from torchspmd).
from torchspmd.lowering import jax_private

__all__ = ["is_divisible", "replicated", "replicated_over", "placement_for", "constraint_for",
           "in_id_order", "is_in_id_order", "mesh_in_id_order"]


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


def is_in_id_order(sharding: jax.sharding.Sharding, ndim: int) -> bool:
    """Whether a program over ``sharding``'s devices can take ``sharding`` as it is.

    >>> is_in_id_order(NamedSharding(mesh_of_2, PartitionSpec("x")), 1)  # doctest: +SKIP
    True
    """
    return in_id_order(sharding, ndim) is sharding


@functools.lru_cache(maxsize=4096)
def in_id_order(sharding: jax.sharding.Sharding, ndim: int) -> jax.sharding.Sharding:
    """``sharding``'s layout over its devices in increasing id order (itself if it is).

    Each device keeps the block it holds; the original order becomes Shardy's logical
    device ids. Shardings XLA chose for a program's outputs (``GSPMDSharding`` with an
    arbitrary device list) come back as ``NamedSharding``s too, which Shardy accepts.

    >>> in_id_order(NamedSharding(Mesh([1, 0]), PartitionSpec("x")), 1)  # doctest: +SKIP
    NamedSharding(mesh=Mesh('_0': 2), spec=P('_0',), logical_device_ids=(1, 0))
    """
    devices = jax_private.device_assignment(sharding)
    logical = jax_private.logical_device_ids(sharding)
    ordered = tuple(sorted(devices, key=lambda d: d.id))
    if sharding.is_fully_replicated:
        plain = isinstance(sharding, NamedSharding) and logical is None
        if devices == ordered and (plain or not isinstance(sharding, NamedSharding)):
            return sharding
        return replicated_over(ordered)
    position = {d: i for i, d in enumerate(ordered)}
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, jax.sharding.Mesh):
        if devices == ordered and logical is None:
            return sharding
        mesh = sharding.mesh
        holders = mesh.devices.flat if logical is None else [devices[i] for i in logical]
        grid = jax.sharding.Mesh(_device_grid(ordered, mesh.axis_sizes), mesh.axis_names,
                                 axis_types=mesh.axis_types)
        return jax_private.named_sharding(grid, sharding.spec, sharding.memory_kind,
                                          tuple(position[d] for d in holders))
    return _from_hlo(sharding, ndim, devices, ordered, position)


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


def _from_hlo(sharding, ndim: int, devices: tuple, ordered: tuple, position: dict):
    """Any tiled sharding as a ``NamedSharding`` over ``ordered``: one mesh axis per tile dim."""
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
    holders = [devices[p] for p in tiles.devices]
    return jax_private.named_sharding(grid, spec, sharding.memory_kind,
                                      tuple(position[d] for d in holders))


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
