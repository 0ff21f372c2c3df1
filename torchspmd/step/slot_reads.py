"""Storages a step reads through a walked slot follow the slot to the tensor it holds now.

A plan reads some state by storage: the tensor a slot held when the step was captured
(``StorageSource`` with a ``slot``), often written back in place (``StorageTarget``).
Gradient accumulation is the case that matters: a micro-step that calls ``backward()``
on full gradients reads each ``p.grad`` and adds to it. After ``opt.zero_grad()`` (which
sets the gradients to None) the next first micro-batch puts *new* gradient tensors in
the slots, and the plan's storages are no longer the ones the slots hold. Such a slot
holding another whole tensor with the same shape and dtype is the same state moved to a
new tensor: the plan reads (and writes in place) that tensor instead of being captured
again. Anything else (a view, another shape or dtype, a tensor the plan already reads
elsewhere, a trainable tensor such as a parameter) still makes the plan stale; a new
tensor laid out otherwise is caught where the inputs are placed (``Plan._placed``).

Example::

    follow = SlotReads.of(captured, reads, writes)
    moved = follow.moved(reads)          # None: a slot holds something else
    if moved:                            # {} when every slot holds its storage still
        reads, writes = follow.rebound(reads, writes, moved)
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step.routes import StorageTarget


@dataclass(frozen=True)
class SlotRead:
    """One storage read through a slot: its source, the in-place writes into the same
    storage (positions in ``Writes.storages``), and the tensor kind a new one must match."""

    source: int
    writes: tuple[int, ...]
    meta: object  # the storage's TensorMeta (shape, dtype)
    requires_grad: bool  # the captured graph's autograd depended on it


@dataclass(frozen=True)
class SlotReads:
    """Per entry of ``Reads.held`` (same order), how that storage may follow its slot."""

    reads: tuple[SlotRead, ...]

    @staticmethod
    def of(captured, reads, writes) -> "SlotReads":
        """Built with the plan, while the captured storages are alive."""
        entries = []
        for i in reads.held_sources:
            storage = captured.sources[i].storage()
            same = tuple(k for k, (_, t) in enumerate(writes.storages)
                         if isinstance(t, StorageTarget) and t.storage() is storage)
            tensor = captured.sources[i].slot.get()
            entries.append(SlotRead(i, same, None if storage is None else storage.meta,
                                    getattr(tensor, "requires_grad", False)))
        return SlotReads(tuple(entries))

    def moved(self, reads) -> dict[int, weakref.ref] | None:
        """``{source: the storage its slot now holds}`` for each slot holding another
        whole tensor of its kind; None if a slot holds anything it cannot follow."""
        moved: dict[int, weakref.ref] = {}
        for (get, ref), read in zip(reads.held, self.reads):
            t = get()
            if isinstance(t, SpmdTensor) and t.handle.storage is ref():
                continue
            # A trainable tensor (a parameter replaced in its module, ``load_state_dict(...,
            # assign=True)``) is not followed: other places (an optimizer's groups) may still
            # hold the old one, and a new capture sees what the step's Python does then.
            if (not isinstance(t, SpmdTensor) or t.handle.view != () or read.meta is None
                    or read.requires_grad or t.requires_grad
                    or t.handle.storage.meta != read.meta or t.handle.meta != read.meta):
                return None
            moved[read.source] = weakref.ref(t.handle.storage)
        if moved:
            taken = [ref() for i, ref in reads.storages if i not in moved]
            new = [ref() for ref in moved.values()]
            # Two slots on one tensor, or a tensor the step also reads another way: the
            # captured program read them apart.
            if len({id(s) for s in new}) != len(new) or any(s in taken for s in new):
                return None
        return moved

    def rebound(self, reads, writes, moved: dict[int, weakref.ref]):
        """``(reads, writes)`` reading, and writing in place, the moved storages."""
        targets = {k: moved[r.source] for r in self.reads if r.source in moved for k in r.writes}
        storages = tuple((i, moved.get(i, ref)) for i, ref in reads.storages)
        held = tuple((get, moved.get(r.source, ref))
                     for (get, ref), r in zip(reads.held, self.reads))
        written = tuple((j, StorageTarget(targets[k]) if k in targets else t)
                        for k, (j, t) in enumerate(writes.storages))
        return (dataclasses.replace(reads, storages=storages, held=held),
                dataclasses.replace(writes, storages=written))
