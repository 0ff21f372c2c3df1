"""The slots a compiled step's walk does not list: reachable from the step's arguments,
closure and globals, but deeper than :data:`~torchspmd.step.places.MAX_DEPTH` or under a
module's ``_``-prefixed attribute. A capture checks them (``capture._unwalked``): a tensor
the step read there is checked before each replay, a new one the step put there refused.

Example::

    unwalked_slots(step, (x,), {}, find_places(step, (x,), {}), lambda t: True)
"""

from __future__ import annotations

import collections.abc
from typing import Callable

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step.places import (SKIPPED_TYPES, Place, Places, attributes, has_attributes,
                                   key_name, place_of, roots)


def unwalked_slots(fn: Callable, args: tuple, kwargs: dict, walked: Places,
                   wanted: Callable[[SpmdTensor], bool]) -> list[tuple[Place, str]]:
    """The slots reachable from ``fn``'s arguments, closure and globals that
    :func:`find_places` does not list (deeper than its depth limit, or under a module's
    ``_``-prefixed attribute), holding a tensor for which ``wanted`` is true; each with
    its path from the root (``"closure variable 'model'._cache['h']"``).

    Example::

        unwalked_slots(step, (x,), {}, find_places(step, (x,), {}), lambda t: True)
    """
    found: list[tuple[Place, str]] = []
    seen: set[int] = set()
    named = [(value, f"argument {i}") for i, value in enumerate(args)]
    named += [(value, f"argument {key!r}") for key, value in kwargs.items()]
    named += [(root.value, root.name) for root in roots(fn)]
    for value, name in named:
        if not isinstance(value, SKIPPED_TYPES) and id(value) not in seen:
            _audit(value, name, walked, wanted, seen, found)
    return found


def _audit(obj, path, walked: Places, wanted, seen: set[int], found: list) -> None:
    """The walk (``places._visit``) without its limits, noting the slots it did not
    list. ``path``: the root's name, or ``(parent path, key, is attribute)`` (a string
    only when found)."""
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if isinstance(obj, SpmdTensor) and (obj.is_leaf or obj.retains_grad):
            _note(place_of(obj, "grad", False), obj.grad, (path, "grad", True), walked, wanted,
                  found)
        return
    items, settable, attribute = _contents(obj)
    for key, value in items:
        if isinstance(value, SKIPPED_TYPES) or id(value) in seen:
            continue
        step = (path, key, attribute)
        if settable and isinstance(value, SpmdTensor):
            _note(place_of(obj, key, not attribute), value, step, walked, wanted, found)
        _audit(value, step, walked, wanted, seen, found)


def _contents(obj) -> tuple[list, bool, bool]:
    """What ``obj`` holds as ``(key, value)`` pairs; whether a value can be replaced
    there; whether the keys are attribute names."""
    if isinstance(obj, (dict, collections.abc.MutableMapping)):
        return list(obj.items()), True, False
    if isinstance(obj, (list, tuple, collections.abc.MutableSequence)):
        return list(enumerate(obj)), not isinstance(obj, tuple), False
    walked_types = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    if isinstance(obj, walked_types) or has_attributes(obj):
        return attributes(obj), True, True
    return [], False, False


def _note(place: Place, value, path, walked: Places, wanted, found: list) -> None:
    if isinstance(value, SpmdTensor) and place not in walked.held and wanted(value):
        found.append((place, _path_name(path)))


def _path_name(path) -> str:
    """``path`` as text: ``"closure variable 'model'._cache['h']"``."""
    parts = []
    while not isinstance(path, str):
        path, key, attribute = path
        parts.append(f".{key}" if attribute else f"[{key_name(key)}]")
    return path + "".join(reversed(parts))
