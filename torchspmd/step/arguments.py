"""A compiled step's arguments (and results) as leaves and a structure that hashes in C.

Every call of a compiled step flattens its arguments to find its tensors and key its
cache. ``torch.utils._pytree.tree_flatten`` builds a TreeSpec whose hash and equality walk
it in Python: for a decode step's twenty arguments that is tens of microseconds of every
token. Plain tuples, lists and dicts (what steps take) are flattened here into the same
leaves, in the same order (a dict's in insertion order), with a nested tuple for their
structure; any other container torch's pytree knows (a namedtuple, an ``OrderedDict``, a
registered dataclass) takes torch's own flatten, its spec wrapped in :class:`TorchSpec`.
Containers torch's pytree would take whole are opened too, so their tensors are the
step's inputs: other mappings (Hugging Face's ``BatchEncoding``, a ``UserDict``), by
their keys, and dataclasses, by their fields.

Example::

    >>> leaves, structure = flatten(((1, [2, None]), {"n": 3}))
    >>> leaves
    [1, 2, None, 3]
    >>> unflatten(leaves, structure)
    ((1, [2, None]), {'n': 3})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten, tree_unflatten

from torchspmd.device.tensor import SpmdTensor

# A structure is None (a leaf) or a tuple: ("t", *children), ("l", *children),
# ("d", keys, *children), ("m", type, keys, *children) for another mapping, or
# ("c", type, field names, *children) for a dataclass.
Structure = Any


@dataclass(frozen=True)
class TorchSpec:
    """Arguments with a container torch's pytree flattens (and this module does not)."""

    spec: Any


class _OtherContainer(Exception):
    pass


# Types that are always leaves (a step's arguments are mostly these).
_LEAVES = frozenset({SpmdTensor, torch.Tensor, int, float, bool, str, type(None)})


def flatten(tree: Any) -> tuple[list, Structure | TorchSpec]:
    """``tree``'s leaves, in ``torch.utils._pytree.tree_flatten``'s order, and its structure."""
    leaves: list = []
    try:
        return leaves, _flatten(tree, leaves)
    except _OtherContainer:
        leaves, spec = tree_flatten(tree)
        return leaves, TorchSpec(spec)


def result_structure(result: Any) -> tuple[list, Structure | TorchSpec]:
    """A step's result as :func:`flatten` gives it, where every container rebuilds (a
    replay returns its new tensors in the same types); else as torch's pytree does,
    which returns an object it cannot open as it is.

    Example: ``leaves, structure = result_structure((loss, {"acc": acc}))``.
    """
    leaves, structure = flatten(result)
    try:
        unflatten(list(leaves), structure)
    except TypeError:
        leaves, spec = tree_flatten(result)
        return leaves, TorchSpec(spec)
    return leaves, structure


def unflatten(leaves: list, structure: Structure | TorchSpec) -> Any:
    """The tree of :func:`flatten`'s ``structure`` with ``leaves`` in it."""
    if isinstance(structure, TorchSpec):
        return tree_unflatten(leaves, structure.spec)
    return _build(structure, iter(leaves))


def _flatten(x: Any, leaves: list) -> Structure:
    kind = type(x)
    if kind in _LEAVES:  # most leaves: skip the container checks below (every call pays them)
        leaves.append(x)
        return None
    if kind is tuple:
        return ("t", *[_flatten(c, leaves) for c in x])
    if kind is list:
        return ("l", *[_flatten(c, leaves) for c in x])
    if kind is dict:
        return ("d", tuple(x), *[_flatten(c, leaves) for c in x.values()])
    if kind in SUPPORTED_NODES or isinstance(x, (tuple, list, dict)):
        raise _OtherContainer
    if isinstance(x, Mapping):
        return ("m", kind, tuple(x), *[_flatten(x[k], leaves) for k in x])
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = tuple(f.name for f in dataclasses.fields(x))
        return ("c", kind, names, *[_flatten(getattr(x, n), leaves) for n in names])
    leaves.append(x)
    return None


def _build(structure: Structure, leaves) -> Any:
    if structure is None:
        return next(leaves)
    tag = structure[0]
    if tag == "t":
        return tuple(_build(c, leaves) for c in structure[1:])
    if tag == "l":
        return [_build(c, leaves) for c in structure[1:]]
    if tag == "d":
        return {k: _build(c, leaves) for k, c in zip(structure[1], structure[2:])}
    kind, names = structure[1], structure[2]
    values = [_build(c, leaves) for c in structure[3:]]
    if tag == "c":  # field by field, as the caller's instance holds them
        rebuilt = kind.__new__(kind)
        for name, value in zip(names, values):
            object.__setattr__(rebuilt, name, value)
        return rebuilt
    try:
        return kind(dict(zip(names, values)))
    except Exception as error:
        raise TypeError(f"torchspmd.compile: cannot rebuild an argument of type "
                        f"{kind.__name__} from a dict ({error}); pass it as a dict") from None
