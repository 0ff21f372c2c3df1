"""What a capture changed, to put back: the values of the storages the step wrote, the
slots it filled or emptied and, for a step torchspmd refuses, the Python values it
rebound and the slots it added. A refused call (a host read, a rebinding) then did not
happen; a capture whose program fails to compile or run puts its tensors back.

Example::

    undo = Undo.of(rec, before, after)   # rec: the step's provenance recording
    undo.apply()                         # as before the step
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchspmd.step.places import Places


@dataclass
class Undo:
    """What a capture changed, to put back if the captured program then fails to compile
    or run: each storage the step wrote, with its value when the step began, and each
    slot the step filled, with the tensor it held (so a parameter is never left holding
    the pending value of a step that did not happen)."""

    values: dict = field(default_factory=dict)  # storage -> its value before the step
    slots: dict = field(default_factory=dict)  # Place -> the tensor (or None) before
    # Place -> the Python value before: globals, closure variables and walked attributes
    # that a refused step rebound (put back only when torchspmd refuses the step)
    python: dict = field(default_factory=dict)
    # Slots the refused step added (optimizer state made on first use): taken out again
    added: tuple = ()
    # The hyperparameters and schedulers before the step (``side_effects.PythonState``)
    state: object = None

    @staticmethod
    def of(rec, before: Places, after: Places, state=None) -> "Undo":
        """What the step recorded in ``rec`` changed between the walks ``before`` and
        ``after`` it (slots read through the walk: a ``.grad`` only where it is a leaf's),
        and ``state`` to restore."""
        python = {place: old for place, old in (*before.rebindable.items(),
                                                *before.numbers.items())
                  if place.get() is not old}
        added = tuple(p for p, t in after.held.items() if t is not None and p not in before.held)
        return Undo({st: rec.initial[st] for st in rec.written
                     if st not in rec.created and st in rec.initial},
                    {place: t for place, t in before.held.items()
                     if after.held.get(place) is not t},
                    python, added, state)

    def tensors_only(self) -> "Undo":
        """This undo less the Python values, added slots and state: what a capture whose
        program then fails puts back (the state a warm-up made is the call's)."""
        return Undo(self.values, self.slots)

    def apply(self) -> None:
        """Put every storage, slot, Python value and schedule back as it was before the
        step."""
        for storage, value in self.values.items():
            if storage.value is not value:
                storage.set(value)
        for place, tensor in (*self.slots.items(), *self.python.items()):
            if place.get() is not tensor:
                place.set(tensor)
        for place in self.added:  # a dict's new key goes; an attribute holds None again
            if place.item and isinstance(place.container, dict):
                place.container.pop(place.key, None)
            elif not place.item:
                place.set(None)
        if self.state is not None:
            self.state.restore()
