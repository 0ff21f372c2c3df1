"""The sharding a graph value was annotated with, looking through identity views.

``nn.Parameter(t)`` and ``t.detach()`` are identity views of ``t``'s storage; they report
and keep the storage's annotation. In-place ops keep their target's annotation
(PyTorch/XLA re-applies it to the new value), so this is read on the hot path of mutation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchspmd.lazy.node import IDENTITY_IDS, Node
from torchspmd.lazy.record import leaf_signature, meta_of, record_unary
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT

if TYPE_CHECKING:  # only named in hints: handle.py builds on views.py, which uses this module
    from torchspmd.lazy.handle import Handle

__all__ = ["peel", "sharded_value", "annotation", "unannotated", "plain_leaf",
           "keep_annotation"]


def peel(value: tuple[Node, int]) -> tuple[Node, int]:
    """``value`` without pending identity views on top (``detach(x)`` is ``x``)."""
    node = value[0]
    # Not ``is_leaf``: a property call on the hot path of every in-place op.
    while node.arrays is None and node.host is None and id(node.sig.op) in IDENTITY_IDS:
        value = node.inputs[0]
        node = value[0]
    return value


def sharded_value(handle: Handle) -> tuple[Node, int]:
    """The graph value whose sharding the tensor of ``handle`` has."""
    if handle.identity or not handle.view:
        return peel(handle.storage.value)
    return peel(handle.value())


def annotation(value: tuple[Node, int]):
    """The sharding ``value`` was annotated with (a leaf's mark, or a constraint), or None."""
    node = value[0]
    if node.sharding is not None:
        return node.sharding
    if node.sig is not None and node.sig.op is SHARDING_CONSTRAINT:
        return node.sig.template[1]
    return None


def unannotated(value: tuple[Node, int]) -> tuple[Node, int]:
    """``value``'s data with no annotation of its own (what ``copy_`` hands its target).

    Pending constraints on top are dropped; an annotated leaf becomes a plain leaf over
    the same data. A value XLA laid out (no annotation) is returned as it is.
    """
    node = value[0]
    while not node.is_leaf and node.sig.op is SHARDING_CONSTRAINT:
        value = node.inputs[0]
        node = value[0]
    if node.is_leaf and annotation(value) is not None:
        return plain_leaf(value)
    return value


def plain_leaf(value: tuple[Node, int]) -> tuple[Node, int]:
    """A new leaf over the data of leaf ``value``, with no annotation and no producing op."""
    node, index = value
    leaf = Node.from_host(node.host) if node.host is not None else Node.from_arrays(
        [node.arrays[index]])
    leaf.sig = leaf_signature(meta_of(value))
    return (leaf, 0)


def keep_annotation(old: tuple[Node, int], new: tuple[Node, int]) -> tuple[Node, int]:
    """``new`` with the annotation ``old`` had (a write through a view keeps the base's)."""
    sharding = annotation(peel(old))
    if sharding is None or annotation(new) is sharding:
        return new
    return record_unary(SHARDING_CONSTRAINT, new, sharding)
