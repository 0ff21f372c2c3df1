"""The sharding state of an spmd tensor's lazy value: read it, constrain it, replace its data.

A tensor's value (``t.handle``) is one of:

- a *pending* graph value: marking it records a ``sharding_constraint`` node (no data moves);
- a *host leaf* (CPU data not yet uploaded): marking it gives the leaf a sharding, so the
  upload sends each device only its shard;
- a *device leaf* (``jax.Array``s): marking it reshards the data device-to-device.

Leaves are never edited in place: a copy of a tensor (``b.copy_(a)``) may share ``a``'s
leaf, so a new leaf is made and assigned to the one tensor being annotated.

An uneven annotation (dims its tiles do not divide) is kept as the tensor's annotation
while the data lives replicated on the sharding's devices (``xla_shardings.placement_for``);
``local_shards`` then cuts the padded shards from it (spec §4.6).
"""

from __future__ import annotations

import jax
import torch
from jax.sharding import NamedSharding

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.annotation import annotation, plain_leaf, sharded_value, unannotated
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import IDENTITY_OPS, Node
from torchspmd.lazy.record import leaf_signature, meta_of, record_unary
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT
from torchspmd.lowering.xla_shardings import is_divisible, placement_for
from torchspmd.runtime import placement
from torchspmd.runtime.manual_regions import is_local_block
from torchspmd.sharding.arguments import spmd_tensor
from torchspmd.sharding.hlo_text import MANUAL_TEXT, sharding_to_hlo_text

__all__ = [
    "Value",
    "as_spmd_tensor",
    "current_value",
    "current_text",
    "in_manual_region",
    "jax_sharding_of",
    "constrain",
    "constrained_copy",
    "is_divisible",
    "placement_for",
    "annotate",
    "unannotated",
    "plain_leaf",
    "new_leaf",
    "replace_leaf",
]

Value = tuple[Node, int]

def as_spmd_tensor(t: torch.Tensor, caller: str = "mark_sharding") -> SpmdTensor:
    """The spmd device tensor behind ``t`` (an ``XLAShardedTensor``'s global tensor).

    >>> as_spmd_tensor(torch.ones(2))  # doctest: +SKIP
    RuntimeError: Expected XLA tensor (an spmd tensor). Got: torch.FloatTensor
    """
    return spmd_tensor(t, caller)


def current_value(t: SpmdTensor) -> Value:
    """The graph value whose sharding ``t`` has: its storage's value for identity views.

    >>> current_value(torch.ones(2, device="spmd"))[0].is_leaf  # doctest: +SKIP
    False
    """
    return sharded_value(t.handle)


def jax_sharding_of(value: Value) -> jax.sharding.Sharding | None:
    """The sharding ``value`` has or will have; ``None`` if none was annotated or chosen.

    An annotated leaf reports its annotation, a constraint (pending or computed) its
    constraint, other computed values the layout XLA gave them.

    >>> jax_sharding_of(current_value(torch.ones(2).to("spmd")))  # doctest: +SKIP
    """
    node, index = value
    annotated = annotation(value)
    if annotated is not None:
        return annotated
    if node.arrays is not None and node.sig is not None and node.sig.op is not None:
        return node.arrays[index].sharding  # computed by a graph: XLA's choice
    return None  # plain uploads and pending values carry no sharding yet


def in_manual_region(value: Value) -> bool:
    """Whether ``value`` is a local block: computed from a manual region's entry
    (``full_to_shard``) without leaving the region (``shard_to_full``) on the way.

    >>> in_manual_region(current_value(enable_manual_sharding(x, (0,), mesh=m)))  # doctest: +SKIP
    True
    """
    return is_local_block(value)


def current_text(t: SpmdTensor) -> str:
    """``t``'s sharding in PyTorch/XLA's V1 text, ``''`` if it has none.

    >>> current_text(torch.ones(2).to("spmd"))  # doctest: +SKIP
    ''
    """
    value = current_value(t)
    if not value[0].is_leaf and in_manual_region(value):
        return MANUAL_TEXT  # a local block of a manual region
    sharding = jax_sharding_of(value)
    return "" if sharding is None else sharding_to_hlo_text(sharding, t.dim())


def constrain(value: Value, sharding: NamedSharding) -> Value:
    """``value`` laid out as ``sharding`` (a constraint on top replaces the old one).

    >>> constrain(v, named_sharding(mesh, ("x", None)))  # doctest: +SKIP
    """
    node, _ = value
    if not node.is_leaf and node.sig.op is SHARDING_CONSTRAINT:
        value = node.inputs[0]  # re-marking a pending value: the newest spec wins
    return record_unary(SHARDING_CONSTRAINT, value, sharding)


def constrained_copy(t: SpmdTensor, sharding: NamedSharding) -> SpmdTensor:
    """A new tensor holding ``t``'s value constrained to ``sharding`` (``t`` is unchanged).

    The copy is row-major, as a tensor of PyTorch/XLA's is: autograd hands a gradient
    with other strides than its parameter's (an expanded ``y.sum()`` gradient) to
    ``.grad`` through ``copy_``, which drops the source's annotation.

    >>> y = constrained_copy(x, named_sharding(mesh, (0, None)))  # doctest: +SKIP
    """
    if not t.is_contiguous():
        t = t.contiguous()
    value = record_unary(SHARDING_CONSTRAINT, t.handle.value(), sharding)
    return SpmdTensor(Handle.new(value, meta_of(value)))


def annotate(t: SpmdTensor, value: Value) -> None:
    """Make ``t`` hold ``value``: its current data, annotated differently.

    A base (or ``nn.Parameter``/``detach()``, identity views of it) changes its storage's
    value, so every alias sees the annotation; any other view keeps ``value`` as its own,
    and its annotation when its base changes, and writes nothing through to its base.

    >>> annotate(x, constrain(current_value(x), sharding))  # doctest: +SKIP
    """
    handle = t.handle
    if all(step.op in IDENTITY_OPS for step in handle.view):
        # Set, not written back: a write keeps the storage's old annotation, and the new
        # annotation must replace it (`x[:, 0:2]` of a 2-column x is an alias of x).
        handle.storage.set(value)
    else:
        handle.hold(value, annotation(value))


def new_leaf(meta, *, host=None, array: jax.Array | None = None,
             sharding: jax.sharding.Sharding | None = None) -> Value:
    """A fresh data leaf (host or device data) annotated with ``sharding``.

    >>> new_leaf(meta, host=np.zeros(4), sharding=s)  # doctest: +SKIP
    """
    node = Node.from_host(host) if host is not None else Node.from_arrays([array])
    node.sig = leaf_signature(meta)
    node.sharding = sharding
    return (node, 0)


def replace_leaf(t: SpmdTensor, value: Value, sharding: jax.sharding.Sharding | None) -> None:
    """Make ``t`` hold data leaf ``value``'s data with annotation ``sharding``.

    Host data stays on the host (the upload will use the layout); device data is moved
    device-to-device when its layout differs from where ``sharding`` stores it.

    >>> replace_leaf(x, current_value(x), named_sharding(mesh, ("x", None)))  # doctest: +SKIP
    """
    node, index = value
    meta = meta_of(value)
    if node.host is not None:
        leaf = new_leaf(meta, host=node.host, sharding=sharding)
    else:
        array = node.arrays[index]
        if sharding is not None:
            array = placement.reshard(array, placement_for(sharding, meta.shape))
        leaf = new_leaf(meta, array=array, sharding=sharding)
    annotate(t, leaf)
