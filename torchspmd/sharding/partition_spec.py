"""Partition specs: validation against a mesh, and their JAX equivalents.

A partition spec has one entry per tensor dim:

- ``int``: a mesh axis index; ``str``: a mesh axis name;
- a tuple of those: the dim is sharded over several mesh axes (major to minor);
- ``None`` (or ``()``): the dim is replicated.

Mesh axes no entry uses are replication axes. Unlike PyTorch/XLA, the spec may be a list
as well as a tuple. Errors (types and messages) are PyTorch/XLA's (spec §1.2).

Results are cached on the mesh, keyed on the spec including its element types, so that
``(True,)`` (invalid) never hits the cache entry of ``(1,)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Union

import torchspmd.jax_setup  # noqa: F401
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

if TYPE_CHECKING:
    from torchspmd.sharding.hlo_text import ShardingType
    from torchspmd.sharding.mesh import Mesh

__all__ = [
    "PartitionSpec",
    "NormalizedSpec",
    "check_rank",
    "normalize",
    "jax_partition_spec",
    "named_sharding",
    "sharding_type",
    "spec_key",
    "cached_per_spec",
]

PartitionSpec = Sequence[Union[tuple[Union[int, str], ...], int, str, None]]
"""One entry per tensor dim: axis index, axis name, tuple of those, or None."""

NormalizedSpec = tuple[Union[tuple[int, ...], None], ...]
"""One entry per tensor dim: the mesh axis indices sharding it (major first), or None."""


def check_rank(spec: PartitionSpec, rank: int) -> None:
    """Assert that ``spec`` has one entry per tensor dim (PyTorch/XLA's message).

    >>> check_rank((0, None), 2)
    """
    assert len(spec) == rank, (
        f"Partition spec length ({len(spec)}) should be equal to the input rank ({rank})."
    )


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


def cached_per_spec(
    mesh: Mesh, tag: str, spec: PartitionSpec, compute: Callable[[], Any], *extra: Hashable
) -> Any:
    """``compute()``, memoized on ``mesh`` under ``(tag, spec, *extra)``.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> cached_per_spec(Mesh([0, 1], (2,)), "len", (0,), lambda: 1)
    1
    """
    key = spec_key(spec)
    if key is None:
        return compute()
    return mesh.cached((tag, key, *extra), compute)


# -- validation ----------------------------------------------------------------------


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
            assert not any(type(x) is tuple for x in p), (
                "Partition spec cannot contain nested tuples"
            )
            # An empty tuple shards over no axis, as in JAX: the dim is replicated.
            out.append(tuple(_translate_axis(mesh, x) for x in p) or None)
        elif p is None:
            out.append(None)
        else:
            out.append(_translate_axis(mesh, p))
    return tuple(out)


def _check_axes(mesh: Mesh, translated: tuple) -> None:
    axes = [a for p in translated if p is not None for a in (p if type(p) is tuple else (p,))]
    assert all(0 <= a < len(mesh.mesh_shape) for a in axes), (
        f"partition_spec ({translated}) contains out of bound index into mesh_shape."
    )
    assert len(axes) == len(set(axes)), (
        f"Each device mesh dimension should appear at most once in partition_spec {translated}."
    )


def normalize(mesh: Mesh, spec: PartitionSpec) -> NormalizedSpec:
    """Validate ``spec`` against ``mesh``; return each dim's mesh axis indices or None.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> mesh = Mesh(range(8), (1, 2, 4), ("r", "b", "m"))
    >>> normalize(mesh, (("r", "m"), None, 1))
    ((0, 2), None, (1,))
    """
    if not isinstance(spec, (tuple, list)):
        raise TypeError(f"Partition spec must be a tuple or a list, got {type(spec)}")
    return cached_per_spec(mesh, "normalize", spec, lambda: _normalize(mesh, spec))


def _normalize(mesh: Mesh, spec: PartitionSpec) -> NormalizedSpec:
    translated = _translate(mesh, spec)
    _check_axes(mesh, translated)
    return tuple(p if p is None or type(p) is tuple else (p,) for p in translated)


# -- JAX equivalents -----------------------------------------------------------------


def jax_partition_spec(mesh: Mesh, spec: PartitionSpec) -> P:
    """The ``jax.sharding.PartitionSpec`` of ``spec``, with the JAX mesh's axis names.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> jax_partition_spec(Mesh(range(8), (2, 4)), (None, (1, 0)))
    P(None, ('_1', '_0'))
    """
    names = mesh.jax_axis_names()
    entries = [None if e is None else tuple(names[a] for a in e) for e in normalize(mesh, spec)]
    return P(*[e[0] if e is not None and len(e) == 1 else e for e in entries])


def named_sharding(mesh: Mesh, spec: PartitionSpec) -> NamedSharding:
    """The ``jax.sharding.NamedSharding`` of ``spec`` over ``mesh.get_jax_mesh()`` (cached).

    >>> from torchspmd.sharding.mesh import Mesh
    >>> named_sharding(Mesh(range(8), (2, 4), ("x", "y")), ("x", None)).spec
    P('x', None)
    """
    return cached_per_spec(
        mesh, "named_sharding", spec,
        lambda: NamedSharding(mesh.get_jax_mesh(), jax_partition_spec(mesh, spec)),
    )


def sharding_type(mesh: Mesh, spec: PartitionSpec) -> ShardingType:
    """The ``ShardingType`` PyTorch/XLA reports for a tensor marked with ``spec``.

    Read back from the final (XLA-normalized) string, like ``.sharding_type``: so on a
    (1, 8) mesh ``(None, 1)`` is TILED and ``(0, None)`` is REPLICATED (spec §1.4).

    >>> from torchspmd.sharding.mesh import Mesh
    >>> sharding_type(Mesh(range(8), (1, 8)), (None, 1)).name
    'TILED'
    """
    # Deferred: hlo_text builds on this module.
    from torchspmd.sharding.hlo_text import parse_hlo_text, spec_to_hlo_text

    return parse_hlo_text(spec_to_hlo_text(mesh, spec, len(spec))).kind
