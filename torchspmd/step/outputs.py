"""Where each value a captured step hands out goes: written storages, filled slots, results.

Fills ``Captured.outputs`` with an :class:`~torchspmd.step.routes.Output` per value the
program computes, and ``Captured.alias_returns`` with the results that are state (a
parameter, ``p.grad``, an argument, or a view of one), which a replay returns as state
rather than as a program output (``routes.AliasReturn``).

Example::

    filled = route(captured, rec, before, after, flat, arg_storages, tensors)
"""

from __future__ import annotations

import collections
import weakref

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step.places import Places
from torchspmd.step.routes import (AliasReturn, ArgTarget, Output, ReturnTarget, SlotTarget,
                                   StorageTarget)
from torchspmd.step.side_effects import RebindingError


def route(captured, rec, before: Places, after: Places, flat: list, arg_storages: dict,
          args: list) -> dict:
    """Fill ``captured.outputs``: written storages, filled slots, results. Returns the
    new tensor put in each filled slot."""
    for storage in rec.written:
        if storage in rec.created:
            continue
        k = arg_storages.get(storage)
        target = ArgTarget(k) if k is not None else StorageTarget(weakref.ref(storage))
        captured.outputs.append(Output(storage.value, target))
    filled = {}
    for place, t in after.held.items():
        old = before.held.get(place)
        if t is old or t is None:
            continue
        if t.handle.storage not in rec.created:
            shifted = (" (a deque at its maxlen shifts its items on each append: append "
                       "outside the step, or keep a fixed-size tensor and write into it)"
                       if isinstance(place.container, collections.deque) else "")
            raise RebindingError(
                f"torchspmd.compile: the step moved an existing tensor into {place}{shifted}; "
                "a compiled step can fill a slot only with a tensor it computes (use .clone())")
        target = SlotTarget(place, t.requires_grad, type(t), was_empty=old is None)
        captured.outputs.append(Output(t.handle.value(), target))
        filled[place] = t
    aliases = []
    in_slots = {t.handle.storage: place for place, t in after.held.items()
                if t is not None and t.handle.storage in rec.created}
    for i, r in enumerate(flat):
        if isinstance(r, SpmdTensor):
            alias = _alias(i, r, rec, after, args, arg_storages, in_slots)
            if alias is not None:
                aliases.append(alias)
            else:
                captured.outputs.append(Output(r.handle.value(), ReturnTarget(i)))
    captured.alias_returns = tuple(aliases)
    return filled


def _alias(position: int, r: SpmdTensor, rec, after: Places, args: list, arg_storages: dict,
           in_slots: dict) -> AliasReturn | None:
    """How a replay returns ``r`` if it shares data with state that outlives the step (an
    argument, a storage older than the step, a tensor the step left in a slot); else None:
    ``r`` is the step's own new value, a program output."""
    storage, handle = r.handle.storage, r.handle
    k = arg_storages.get(storage)
    if k is not None:
        holder, itself, tensor = ArgTarget(k), args[k] is r, None
    elif storage not in rec.created:  # a parameter, a moment, a gradient kept in place
        whole = handle.whole  # the tensor itself (or a detach() of it), not a part of it
        holder, itself = StorageTarget(weakref.ref(storage)), whole
        tensor = weakref.ref(r) if whole else None
    elif storage in in_slots:
        place = in_slots[storage]
        holder, itself, tensor = place, after.held[place] is r, None
    else:
        return None
    return AliasReturn(position, holder, handle.meta, handle.view, handle.identity, itself, tensor)


def autograd_expected(flat: list, ran_backward: bool) -> bool:
    """Whether the step returns a tensor with an autograd history yet ran no backward: a
    model's forward compiled as ``torch.compile(model)`` would be, whose results the
    caller means to call ``.backward()`` on. A compiled step's results have no history,
    so that would fail far from the cause (``api._warn_no_autograd``)."""
    return not ran_backward and any(isinstance(r, SpmdTensor) and r.grad_fn is not None
                                    for r in flat)
