"""The argument signature a compiled step is cached under.

Two calls share a capture when their arguments have the same structure, the same
tensor shapes, dtypes, ``requires_grad`` and layouts (shardings, device order), the same
non-tensor values, the same tensors sharing data (``step(x, x)``), and run under the same
grad mode and autocast state: what ``jax.jit`` keys its cache on, plus PyTorch's modes
that change which ops run.

Example::

    key, tensors = signature((x, 3), {"train": True})
    # tensors == [x]; key changes if x's shape, dtype or sharding changes, or 3 does
"""

from __future__ import annotations

import functools

import torch

from torchspmd.device.tensor import DEVICE, SpmdTensor
from torchspmd.lowering import jax_private
from torchspmd.step.arguments import flatten


class UnhashableArgument(TypeError):
    """A non-tensor argument of a compiled step cannot be part of its cache key."""


class Key:
    """A signature's parts with their hash computed once: a replay looks its key up in the
    step's cache, and a tuple holding a pytree spec would hash it again on every lookup."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self._hash == other._hash and self.parts == other.parts

    def __repr__(self) -> str:
        return f"Key{self.parts!r}"


def signature(args: tuple, kwargs: dict, flat: tuple | None = None) -> tuple[Key, list[SpmdTensor]]:
    """The cache key of a call, and its spmd tensor arguments in flattening order
    (``flat``: ``arguments.flatten((args, kwargs))`` if the caller has it already)."""
    leaves, spec = flatten((args, kwargs)) if flat is None else flat
    key: list = [spec, torch.is_grad_enabled(), _autocast()]
    tensors: list[SpmdTensor] = []
    for leaf in leaves:
        if isinstance(leaf, SpmdTensor):
            tensors.append(leaf)
            key.append(_tensor_key(leaf))
        elif isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"torchspmd.compile: an argument is a tensor on {leaf.device}; compiled steps "
                "take spmd tensors (move it with .to(torchspmd.device()) before the call)")
        else:
            try:
                hash(leaf)
            except TypeError:
                raise UnhashableArgument(
                    f"torchspmd.compile: argument {leaf!r} of type {type(leaf).__name__} is "
                    "neither a tensor nor hashable, so it cannot key the step's cache; pass "
                    "tensors, numbers, strings or tuples, or read it from a closure") from None
            key.append((type(leaf), leaf))
    if len(tensors) > 1:
        key.append(_sharing(tensors))
    return Key(tuple(key)), tensors


def _sharing(tensors: list[SpmdTensor]) -> tuple[int, ...] | None:
    """Per tensor argument, the first one holding the same data (``step(x, x)``), or None
    if no two do: a step captured reading one leaf for both must not be replayed with
    two different tensors."""
    first: dict[int, int] = {}
    found = []
    for k, t in enumerate(tensors):
        node, index = t.handle.value()
        data = node.arrays[index] if node.arrays is not None else t.handle.storage
        found.append(first.setdefault(id(data), k))
    return tuple(found) if len(first) < len(tensors) else None


def _autocast() -> tuple | None:
    """The spmd device's autocast state (``torch.autocast("spmd", ...)`` changes the ops
    and dtypes a step records), None when off."""
    if not torch.is_autocast_enabled(DEVICE.type):
        return None
    return torch.get_autocast_dtype(DEVICE.type), torch.is_autocast_cache_enabled()


def _tensor_key(t: SpmdTensor) -> tuple:
    handle = t.handle
    node, index = handle.value() if not handle.view else (None, 0)
    layout = None
    if node is not None and node.arrays is not None:
        layout = _layout(node.arrays[index].sharding)
    elif node is not None:
        # The sharding itself (hashed and compared by value), never its id: an id may be
        # reused by another sharding once this one is collected.
        layout = ("pending", node.sharding if node.host is not None else None)
    return (tuple(t.shape), t.dtype, t.requires_grad, bool(handle.view), layout)


@functools.lru_cache(maxsize=256)
def _layout(sharding) -> tuple:
    """A sharding and its devices in program order (a replay reads the same few layout
    objects on every call: worked out once each)."""
    return sharding, tuple(d.id for d in jax_private.device_assignment(sharding))
