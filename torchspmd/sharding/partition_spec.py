"""Partition specs: a user's spec, checked and resolved once into a :class:`MeshSpec`.

A partition spec has one entry per tensor dim:

- ``int``: a mesh axis index; ``str``: a mesh axis name;
- a tuple of those: the dim is sharded over several mesh axes (major to minor);
- ``None`` (or ``()``): the dim is replicated.

Mesh axes no entry uses are replication axes. Unlike PyTorch/XLA, the spec may be a list
as well as a tuple. Errors (types and messages) are PyTorch/XLA's (spec §1.2).

The sharding API resolves a spec once, where it enters (``resolve``); everything below
takes the resulting :class:`MeshSpec` (as JAX's ``NamedSharding`` holds a mesh and a
spec, and torch's ``DTensorSpec`` a mesh and its placements). Resolutions are cached on
the mesh, keyed on the spec including its element types, so that ``(True,)`` (invalid)
never hits the cache entry of ``(1,)``.

Example::

    >>> from torchspmd.sharding.mesh import Mesh
    >>> spec = resolve(Mesh(range(8), (2, 4), ("x", "y")), ("y", None), rank=2)
    >>> spec.axes, spec.named_sharding.spec
    (((1,), None), P('y', None))
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Union

import torchspmd.jax_setup  # noqa: F401
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement
from torchspmd.sharding.mesh import check
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

if TYPE_CHECKING:
    from torchspmd.sharding.mesh import Mesh

__all__ = [
    "PartitionSpec",
    "MeshSpec",
    "resolve",
    "check_spec",
    "named_sharding",
    "spec_key",
    "spec_to_placements",
]

PartitionSpec = Sequence[Union[tuple[Union[int, str], ...], int, str, None]]
"""One entry per tensor dim: axis index, axis name, tuple of those, or None."""


@dataclass(frozen=True)
class MeshSpec:
    """A partition spec resolved against its mesh: per tensor dim, the mesh axis indices
    sharding it (major first), or None where the dim is replicated.

    Immutable; two are equal (and hash alike) when they shard the same dims over the same
    axes of equal meshes, however the spec was spelled (``("x",)``, ``(0,)``, ``[("x",)]``).
    ``spec`` keeps the spelling the user gave, for messages and ``partition_spec``.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> mesh = Mesh(range(8), (1, 2, 4), ("r", "b", "m"))
    >>> s = resolve(mesh, (("r", "m"), None, 1))
    >>> s.axes, s.rank, s.axis_names
    (((0, 2), None, (1,)), 3, (('r', 'm'), None, ('b',)))
    >>> s == resolve(mesh, [(0, 2), (), "b"])
    True
    """

    mesh: Mesh
    axes: tuple[tuple[int, ...] | None, ...]
    spec: tuple = field(default=(), compare=False)

    @property
    def rank(self) -> int:
        """The rank of the tensors this spec fits (one entry per dim)."""
        return len(self.axes)

    @property
    def axis_names(self) -> tuple[tuple[str, ...] | None, ...]:
        """``axes`` with the JAX mesh's axis names (``"_0"``... on an unnamed mesh)."""
        names = self.mesh.jax_axis_names()
        return tuple(None if e is None else tuple(names[a] for a in e) for e in self.axes)

    @cached_property
    def jax_partition_spec(self) -> P:
        """The ``jax.sharding.PartitionSpec``, with the JAX mesh's axis names."""
        return P(*[e[0] if e is not None and len(e) == 1 else e for e in self.axis_names])

    @cached_property
    def named_sharding(self) -> NamedSharding:
        """The ``jax.sharding.NamedSharding`` over ``mesh.get_jax_mesh()``."""
        return NamedSharding(self.mesh.get_jax_mesh(), self.jax_partition_spec)


def spec_to_placements(spec: Sequence, axis_names: Sequence[str | int]) -> list[Placement]:
    """The per-mesh-dim placements of partition ``spec`` (entries name mesh axes).

    >>> spec_to_placements((None, "tp"), ("dp", "tp"))
    [Replicate(), Shard(dim=1)]
    """
    placements: list[Placement] = [Replicate() for _ in axis_names]
    for dim, entry in enumerate(spec):
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is None:
                continue
            if axis not in axis_names:
                raise ValueError(f"torchspmd: partition spec entry {axis!r} names no mesh "
                                 f"axis of {tuple(axis_names)}.")
            index = list(axis_names).index(axis)
            if isinstance(placements[index], Shard):
                raise ValueError(f"torchspmd: mesh axis {axis!r} splits two tensor dims.")
            placements[index] = Shard(dim)
    return placements


def check_spec(spec: Any, rank: int, caller: str) -> None:
    """A partition spec must be a tuple or list with one entry per tensor dim.

    The rank assertion and its message are PyTorch/XLA's.

    >>> check_spec((0, None), 2, "mark_sharding")
    """
    if not isinstance(spec, (tuple, list)):
        raise TypeError(
            f"{caller}: partition_spec must be a tuple with one entry per tensor dim (a mesh "
            f"axis index or name, a tuple of them, or None), got {spec!r}. To replicate a "
            f"rank-{rank} tensor pass {(None,) * rank}.")
    check(len(spec) == rank,
          f"Partition spec length ({len(spec)}) should be equal to the input rank ({rank}).")


def resolve(mesh: Mesh, spec: PartitionSpec, rank: int | None = None,
            caller: str = "partition spec") -> MeshSpec:
    """Check ``spec`` (against ``rank`` when given) and resolve it against ``mesh`` (cached).

    >>> from torchspmd.sharding.mesh import Mesh
    >>> resolve(Mesh(range(8), (2, 4)), (None, (1, 0)), rank=2).axes
    (None, (1, 0))
    """
    if rank is not None:
        check_spec(spec, rank, caller)
    elif not isinstance(spec, (tuple, list)):
        raise TypeError(f"Partition spec must be a tuple or a list, got {type(spec)}")
    key = spec_key(spec)
    if key is None:  # an unhashable entry: invalid, and _resolve says why
        return _resolve(mesh, spec)
    return mesh.cached(("resolve", key), lambda: _resolve(mesh, spec))


def named_sharding(mesh: Mesh, spec: PartitionSpec) -> NamedSharding:
    """``resolve(mesh, spec).named_sharding``: for callers holding a raw spec.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> named_sharding(Mesh(range(8), (2, 4), ("x", "y")), ("x", None)).spec
    P('x', None)
    """
    return resolve(mesh, spec).named_sharding


# -- caching -------------------------------------------------------------------------


def _entry_key(entry: Any) -> Hashable:
    if type(entry) is tuple:
        return (tuple, *(_entry_key(e) for e in entry))
    hash(entry)  # unhashable entries are invalid anyway: let the caller skip the cache
    return (type(entry), entry)


def spec_key(spec: PartitionSpec) -> Hashable | None:
    """A hashable key for ``spec`` that tells ``1``, ``True`` and ``1.0`` apart.

    ``None`` when the spec holds unhashable entries (it is then invalid).

    >>> spec_key([0, None]) == spec_key((0, None))
    True
    >>> spec_key((1,)) == spec_key((True,))
    False
    """
    try:
        return tuple(_entry_key(e) for e in spec)
    except TypeError:
        return None


# -- resolution ----------------------------------------------------------------------


def _translate_axis(mesh: Mesh, p: Any) -> int:
    if type(p) is int:
        return p
    if type(p) is str:
        idx = mesh.get_axis_name_idx(p)
        if idx is None:
            raise ValueError(f"Axis name {p} is not defined in the given mesh")
        return idx
    raise ValueError(f"Spec type {type(p)} is not supported in partition spec")


def _translate(mesh: Mesh, spec: PartitionSpec) -> tuple:
    """Names -> indices, keeping the spec's structure (PyTorch/XLA's translation)."""
    out: list = []
    for p in spec:
        if type(p) is tuple:
            check(not any(type(x) is tuple for x in p), "Partition spec cannot contain nested tuples")
            # An empty tuple shards over no axis, as in JAX: the dim is replicated.
            out.append(tuple(_translate_axis(mesh, x) for x in p) or None)
        elif p is None:
            out.append(None)
        else:
            out.append(_translate_axis(mesh, p))
    return tuple(out)


def _check_axes(mesh: Mesh, translated: tuple) -> None:
    axes = [a for p in translated if p is not None for a in (p if type(p) is tuple else (p,))]
    check(all(0 <= a < len(mesh.mesh_shape) for a in axes),
          f"partition_spec ({translated}) contains out of bound index into mesh_shape.")
    check(len(axes) == len(set(axes)),
          f"Each device mesh dimension should appear at most once in partition_spec {translated}.")


def _resolve(mesh: Mesh, spec: PartitionSpec) -> MeshSpec:
    translated = _translate(mesh, spec)
    _check_axes(mesh, translated)
    axes = tuple(p if p is None or type(p) is tuple else (p,) for p in translated)
    return MeshSpec(mesh, axes, tuple(spec))
