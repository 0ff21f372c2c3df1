"""Old gradients recycled: the buffers of the gradients a compiled step replaces go to the
program, which writes the new gradients into them.

After ``zero_grad()`` a step fills each ``p.grad`` with a new tensor and the old one is
dropped. Dropped, its device buffer is freed before the launch (about 15 µs of host time
per 8-shard array, before the device can start) and the program allocates a new one.
Donated instead, the buffer is written in place. For that the old gradient must have the
layout the program was compiled for: the program constrains each new gradient to its
parameter's layout (where the partitioner puts it anyway), so each call's gradients are
the next call's spares. A gradient that anything else still holds (kept from an earlier
step, a view of it) is never donated: a fresh buffer of that layout goes instead. A
gradient nothing but its slot holds even stays in the slot and takes the new value: no
one can tell it from a new tensor, and making and dropping one per parameter per call
is host time before the launch.

Example::

    spares = Spares(places, metas)          # the step's refilled ``.grad`` slots
    spares.shardings = spares.parameter_layouts(layout_of)   # at the first compile
    arrays, recycled, kept = spares.take(first=False)   # the old gradients' buffers
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.runtime.ownership import GradientSlot, sole_gradient


class Spares:
    """The ``.grad`` slots a step refills, and the layout each new gradient is given."""

    def __init__(self, places: list, metas: list):
        self.places = places
        self.metas = metas
        self.nbytes = [math.prod(m.shape) * to_jax_dtype(m.dtype).itemsize for m in metas]
        self._fits = [_Fits() for _ in places]
        self._shardings: list | None = None
        # What ``ownership.sole_gradient`` reads of each slot.
        self._slots = [GradientSlot(get=place.getter(), clear=functools.partial(place.set, None),
                                    handle_of=_base_handle, usable=fits.check,
                                    keeps=SpmdTensor)
                       for place, fits in zip(places, self._fits)]

    @property
    def shardings(self) -> list | None:
        """Per slot, the layout its new gradient is given (once compiled), or None."""
        return self._shardings

    @shardings.setter
    def shardings(self, shardings: list | None) -> None:
        self._shardings = shardings
        for fits, sharding in zip(self._fits, shardings or ()):
            fits.sharding, fits.matched = sharding, None

    def parameter_layouts(self, layout_of) -> list | None:
        """Each slot's parameter's layout (``layout_of(parameter)``: where the step reads
        it), or None if one has none to give (then nothing is recycled)."""
        found = []
        for place, meta in zip(self.places, self.metas):
            param = place.container
            if not isinstance(param, SpmdTensor) or param.handle.meta[::2] != meta[::2]:
                return None
            layout = layout_of(param)
            if layout is None:
                return None
            found.append(layout)
        return found

    def take(self, first: bool) -> tuple[list, int, list]:
        """Their old gradients' arrays where nothing else holds them, else fresh buffers;
        how many bytes were recycled; and per slot, the old gradient tensor if only its
        slot holds it (it stays there and takes the new value), else None (the slot is
        emptied)."""
        arrays, recycled, missing = [], 0, []
        reused = [None] * len(self.places)
        for k, place in enumerate(self.places):
            array = None
            if not first:
                array, reused[k] = sole_gradient(self._slots[k])
            if array is None:
                place.set(None)
                missing.append(k)
            else:
                recycled += self.nbytes[k]
            arrays.append(array)
        if missing:  # one program makes them all
            blanks = _blanks(tuple((self.metas[k].shape, to_jax_dtype(self.metas[k].dtype),
                                    self.shardings[k]) for k in missing))()
            for k, blank in zip(missing, blanks):
                arrays[k] = blank
        return arrays, recycled, reused


class _Fits:
    """Whether an array (live) has the layout a slot's new gradient is given."""

    __slots__ = ("sharding", "matched")

    def __init__(self):
        self.sharding = None
        # The last layout object found equal to ``sharding`` (outputs carry the same
        # object on every call: compared by identity).
        self.matched = None

    def check(self, array) -> bool:
        if array.is_deleted():
            return False
        sharding = array.sharding
        if sharding is not self.matched:
            if sharding != self.sharding:
                return False
            self.matched = sharding
        return True


def _base_handle(tensor):
    """``tensor``'s lazy handle if it is an spmd tensor that is no view, else None."""
    if isinstance(tensor, SpmdTensor) and not tensor.handle.view:
        return tensor.handle
    return None


@functools.lru_cache(maxsize=64)
def _blanks(specs: tuple):
    """A jitted ``() -> [zeros]`` for ``specs`` of (shape, dtype, sharding)."""
    return jax.jit(lambda: [jnp.zeros(shape, dtype) for shape, dtype, _ in specs],
                   out_shardings=[sharding for _, _, sharding in specs])
