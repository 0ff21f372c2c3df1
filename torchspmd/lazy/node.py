"""IR nodes: one recorded aten call, or a leaf holding device or host data.

A value in the graph is ``(node, index)``: output ``index`` of ``node``. A node is a
leaf once it holds data (``arrays``) or host data waiting to be uploaded (``host``);
executing a graph turns its root nodes into leaves and drops their operands, so memory
held by intermediate values is freed as soon as nothing pending needs it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

aten = torch.ops.aten
# Op classifications that several lazy modules ask about, kept here at the bottom of
# lazy/ so that they import it and not each other.
# Views whose value is their input's (same shape, strides and data).
IDENTITY_OPS = frozenset({aten.detach.default, aten.alias.default, aten.lift_fresh.default})
# The same ops by ``id``: ``op in IDENTITY_OPS`` hashes an OpOverload through Python code,
# and the in-place and view paths ask it for every write and view (ops are singletons).
IDENTITY_IDS = frozenset(map(id, IDENTITY_OPS))


class TensorMeta(NamedTuple):
    """Shape, strides and dtype of one tensor, as PyTorch's meta kernels infer them.

    A tuple, because it is part of every shape-cache key and hashing it is on the hot path.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class Signature:
    """What makes two nodes the same computation, interned: equal signatures share ``id``.

    ``template`` is the call's arguments with tensors replaced by :data:`TENSOR` and
    Python values that are graph inputs by :class:`ScalarSlot`; ``kw_template`` the same
    for keyword arguments. ``outputs`` holds a :class:`TensorMeta` per tensor output
    (``None`` for outputs that are not tensors).
    """

    id: int
    op: Any
    template: tuple
    kw_template: tuple
    outputs: tuple


class _TensorSlot:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TENSOR"


TENSOR = _TensorSlot()


class StaticFloat(float):
    """A float static argument, never equal to an int of the same value in cache keys.

    Python has ``1 == 1.0 == True`` with equal hashes, but ``arange(0, 3, 1)`` is int64
    and ``arange(0., 3., 1.)`` float32: templates must tell them apart. Compared by bits,
    so a NaN argument still finds its cache entry.
    """

    __slots__ = ()

    def __eq__(self, other) -> bool:
        return type(other) is StaticFloat and float.hex(self) == float.hex(other)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((StaticFloat, float.hex(self)))


@dataclass(frozen=True, slots=True)
class ScalarSlot:
    """A Python number that is a graph input (its value may change without recompiling)."""

    kind: type  # int, float or bool


class Node:
    """One recorded op (``sig``, ``inputs``, ``scalars``) or a leaf (``arrays``/``host``)."""

    __slots__ = ("seq", "sig", "inputs", "scalars", "arrays", "host", "sharding", "ran",
                 "__weakref__")

    # Creation order: graphs list their roots in it, so the same program gets the same key.
    _counter = itertools.count()

    def __init__(self, sig: Signature | None, inputs: tuple = (), scalars: tuple = ()):
        self.seq = next(Node._counter)
        self.sig = sig
        self.inputs = inputs  # tuple of (Node, index) values
        self.scalars = scalars  # Python numbers for the ScalarSlots, in template order
        self.arrays = None  # list of jax.Array, one per output, once computed
        self.host = None  # numpy array not yet uploaded (leaves made from CPU data)
        self.sharding = None  # a leaf's annotated sharding (uploads use it; None: replicated)
        self.ran = False  # computed by a program already (metrics count work run twice)

    @classmethod
    def from_arrays(cls, arrays: list) -> "Node":
        node = cls(None)
        node.arrays = arrays
        return node

    @classmethod
    def from_host(cls, host) -> "Node":
        node = cls(None)
        node.host = host
        return node

    @property
    def is_leaf(self) -> bool:
        return self.arrays is not None or self.host is not None

    def materialized(self, arrays: list) -> None:
        """Become a leaf holding ``arrays``; operands are released."""
        self.arrays = arrays
        self.inputs = ()
        self.scalars = ()

    def __repr__(self) -> str:
        if self.arrays is not None:
            return f"Node(data {[getattr(a, 'shape', None) for a in self.arrays]})"
        if self.host is not None:
            return f"Node(host {self.host.shape} {self.host.dtype})"
        return f"Node({self.sig.op}, {len(self.inputs)} inputs)"
