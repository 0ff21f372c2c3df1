"""The shardings a planner chooses between, for one group of parameters and for the batch.

For a group, over the mesh axes larger than 1:

- ``replicate``;
- ``fsdp(S)``: each weight's largest dim over the axes ``S`` (each axis alone, and all of
  them together on a mesh of more than one axis): FSDP / ZeRO-3;
- for a tensor-parallel unit, ``megatron(a)``: the columns split their output features
  and the row its input features over axis ``a`` (one all-reduce per unit forward), and
  ``megatron(a)+fsdp(S)``: that, and the largest dim still whole over the other axes.

The batch (dim 0 of every input) goes over any set of axes whose size divides it.

Example::

    >>> import torchspmd as xs, numpy as np
    >>> mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    >>> [c.name for c in group_candidates("unit", mesh)]
    ['replicate', 'fsdp(data)', 'fsdp(model)', 'fsdp(data,model)', 'megatron(data)', 'megatron(data)+fsdp(model)', 'megatron(model)', 'megatron(model)+fsdp(data)']
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from torchspmd.auto_shard.roles import Layer
from torchspmd.sharding import Mesh

__all__ = ["Candidate", "group_candidates", "batch_candidates", "weight_spec",
           "activation_specs", "axes_entry", "bias_spec", "positions"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One choice for a group: ``tp`` axis (Megatron, or None) and ``fsdp`` axes."""

    tp: str | None = None
    fsdp: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        parts = ([f"megatron({self.tp})"] if self.tp else []) + \
                ([f"fsdp({','.join(self.fsdp)})"] if self.fsdp else [])
        return "+".join(parts) or "replicate"


def _axes(mesh: Mesh) -> list[tuple[str, int]]:
    return [(name, size) for name, size in mesh.shape().items() if size > 1]


def _axis_sets(names: list[str]) -> list[tuple[str, ...]]:
    sets = [(n,) for n in names]
    return sets + ([tuple(names)] if len(names) > 1 else [])


def group_candidates(kind: str, mesh: Mesh) -> list[Candidate]:
    """The candidates of a group of ``kind`` (``linear``, ``embedding``, ``unit``)."""
    names = [n for n, _ in _axes(mesh)]
    found = [Candidate()] + [Candidate(fsdp=s) for s in _axis_sets(names)]
    if kind == "unit":
        for tp in names:
            rest = tuple(n for n in names if n != tp)
            found.append(Candidate(tp=tp))
            if rest:
                found.append(Candidate(tp=tp, fsdp=rest))
    return found


def batch_candidates(mesh: Mesh, batch: int) -> list[tuple[str, ...]]:
    """Axis sets the batch may be split over (``()``: replicated), largest first."""
    names = [n for n, _ in _axes(mesh)]
    sizes = dict(_axes(mesh))
    subsets = [s for r in range(len(names), 0, -1) for s in itertools.combinations(names, r)]
    found = [s for s in subsets if batch % math.prod(sizes[a] for a in s) == 0]
    return found or [()]


def axes_entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    """A partition-spec entry for ``axes``: None, one name, or a tuple of names."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _size(mesh: Mesh, axes) -> int:
    shape = mesh.shape()
    return math.prod(shape[a] for a in axes)


def weight_spec(layer: Layer, position: str, candidate: Candidate,
                mesh: Mesh) -> tuple | None:
    """The weight's partition spec as ``position`` (``column``/``row``/``single``) of a
    group under ``candidate``; None when a split dim is not divisible by its axes."""
    spec: list = [None] * len(layer.shape)
    if candidate.tp is not None:
        dim = layer.out_dim if position == "column" else layer.in_dim
        if layer.shape[dim] % _size(mesh, (candidate.tp,)):
            return None
        spec[dim] = candidate.tp
    if candidate.fsdp:
        n = _size(mesh, candidate.fsdp)
        free = [d for d in range(len(spec)) if spec[d] is None and layer.shape[d] % n == 0]
        if not free:
            return None
        spec[max(free, key=lambda d: (layer.shape[d], -d))] = axes_entry(candidate.fsdp)
    return tuple(spec)


def bias_spec(layer: Layer, position: str, candidate: Candidate) -> tuple:
    """A column's bias follows its output features; every other bias is replicated."""
    return (candidate.tp,) if candidate.tp is not None and position == "column" else (None,)


def activation_specs(layer: Layer, position: str, candidate: Candidate,
                     batch: tuple[str, ...]) -> tuple[tuple, tuple] | None:
    """(input spec, output spec) of ``layer``'s activations; None if they clash (the batch
    and the Megatron split on one axis)."""
    if candidate.tp is not None and candidate.tp in batch:
        return None
    lead = axes_entry(batch) if layer.batched else None
    rank_in = len(layer.activation)
    x = [lead] + [None] * (rank_in - 1) if rank_in else []
    rank_out = rank_in if layer.kind == "linear" else rank_in + 1
    y = [lead] + [None] * (rank_out - 1) if rank_out else []
    if candidate.tp is not None and position == "row":
        x[-1] = candidate.tp
    if candidate.tp is not None and position == "column":
        y[-1] = candidate.tp
    return tuple(x), tuple(y)


def positions(count: int, kind: str) -> list[str]:
    """The position of each layer of a group: columns then the row, or ``single``."""
    return ["column"] * (count - 1) + ["row"] if kind == "unit" else ["single"] * count
