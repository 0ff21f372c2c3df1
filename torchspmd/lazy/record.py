"""Recording a node: one aten call becomes one IR node (shape inference from the cache)."""

from __future__ import annotations

import weakref

from torchspmd.lazy.node import TENSOR, Node, Signature, StaticFloat, TensorMeta
from torchspmd.lazy.shapes import signature

# The node recorded last (weakly: it must not keep a graph alive). Checkpoint
# recomputation orders itself after it (``device/checkpoint_fence.py``).
_LATEST: list = [lambda: None]


def record(op, template: tuple, kw_template: tuple, inputs: tuple, metas: tuple,
           scalars: tuple = ()) -> Node:
    """A new node for ``op``; ``inputs`` are the values of the template's tensor slots.

    Example: ``record(aten.neg.default, (TENSOR,), (), (x,), (x_meta,))``.
    """
    node = Node(signature(op, template, kw_template, metas, scalars), inputs, scalars)
    _LATEST[0] = weakref.ref(node)
    return node


def latest_node() -> Node | None:
    """The node recorded last, if it is still referenced (``None`` otherwise)."""
    return _LATEST[0]()


def meta_of(value: tuple[Node, int]) -> TensorMeta:
    """The :class:`TensorMeta` of a graph value."""
    node, index = value
    return node.sig.outputs[index]


def leaf_signature(meta: TensorMeta) -> Signature:
    """The signature of a data leaf: no op, one output."""
    return Signature(-1, None, (), (), (meta,))


def freeze(arg):
    """A hashable template entry for a static argument (lists become tuples, floats
    :class:`StaticFloat` so that ``1.0`` and ``1`` key different signatures)."""
    kind = type(arg)
    if kind is int or arg is None:  # most static arguments: sizes and dims
        return arg
    if kind is float:
        return StaticFloat(arg)
    if isinstance(arg, (list, tuple)):  # ints inline: this runs for every view and size list
        return tuple([a if type(a) is int else freeze(a) for a in arg])
    return arg


def record_unary(op, value: tuple[Node, int], *static) -> tuple[Node, int]:
    """Record ``op(value, *static)`` where only the first argument is a tensor; its value."""
    template = (TENSOR, *map(freeze, static))
    return (record(op, template, (), (value,), (meta_of(value),)), 0)


def record_binary(op, a: tuple[Node, int], b: tuple[Node, int], *static) -> tuple[Node, int]:
    """Record ``op(a, b, *static)``; its value."""
    template = (TENSOR, TENSOR, *map(freeze, static))
    return (record(op, template, (), (a, b), (meta_of(a), meta_of(b))), 0)
