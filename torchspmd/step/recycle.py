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
import sys
import weakref

import jax
import jax.numpy as jnp

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.runtime.aliases import shares_buffers


class Spares:
    """The ``.grad`` slots a step refills, and the layout each new gradient is given."""

    def __init__(self, places: list, metas: list):
        self.places = places
        self.metas = metas
        self.shardings: list | None = None  # per slot, once compiled
        # Per slot: the bytes of its buffer, and the last layout object found equal to its
        # sharding (outputs carry the same object on every call: compared by identity).
        self.nbytes = [math.prod(m.shape) * to_jax_dtype(m.dtype).itemsize for m in metas]
        self._matched: list = [None] * len(places)
        self._getters = [place.getter() for place in places]

    def parameter_layouts(self, layout_of) -> list | None:
        """Each slot's parameter's layout (``layout_of(parameter)``: where the step reads
        it), or None if one has none to give (then nothing is recycled)."""
        found = []
        for place, meta in zip(self.places, self.metas):
            param = place.container
            if not isinstance(param, SpmdTensor) or param._h.meta[::2] != meta[::2]:
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
                array, reused[k] = self._old(place, self._getters[k], k)
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

    def _old(self, place, get, k: int) -> tuple:
        """The old gradient's array if only its slot holds it, and the gradient itself if
        it can stay in its slot (None: the slot is emptied)."""
        getrefcount = sys.getrefcount
        old = get()
        if not isinstance(old, SpmdTensor) or old._h.view:
            return None, None
        handle = old._h
        storage = handle.storage
        value = storage.value
        node = value[0]
        array = node.arrays[value[1]] if node.arrays is not None else None
        if array is None or array.is_deleted() or not self._fits(array, k):
            return None, None
        # Held by the slot alone (no other Python reference, weak reference or C++
        # holder such as a graph that saved it for backward), and what a new gradient
        # would be (a plain tensor, no grad): the tensor is kept and its storage takes
        # the new value, instead of a tensor dropped and one made.
        # References: to the tensor, its ``use_count`` from the slot and its Python
        # object, then the object's owner, this local and getrefcount's; to the
        # handle, storage, value, node and array, their one holder, this local and
        # getrefcount's.
        if (type(old) is SpmdTensor and not old.requires_grad and old._use_count() == 2
                and getrefcount(old) == 3 and not weakref.getweakrefcount(old)
                and getrefcount(handle) == 3 and getrefcount(storage) == 3
                and getrefcount(value) == 3 and getrefcount(node) == 3
                and getrefcount(array) == 3 and not shares_buffers(array)):
            return array, old
        alive = weakref.ref(old)
        place.set(None)
        del old, handle, storage
        # Expected references once the tensor is gone: to the value tuple, this local and
        # getrefcount's; to the node, the tuple, this local and getrefcount's; to the
        # array, ``node.arrays``, this local and getrefcount's.
        if (alive() is not None or getrefcount(value) > 2 or getrefcount(node) > 3
                or getrefcount(array) > 3 or shares_buffers(array)):
            return None, None
        return array, None

    def _fits(self, array, k: int) -> bool:
        """Whether ``array`` has the layout slot ``k``'s new gradient is given."""
        sharding = array.sharding
        if sharding is not self._matched[k]:
            if sharding != self.shardings[k]:
                return False
            self._matched[k] = sharding
        return True


@functools.lru_cache(maxsize=64)
def _blanks(specs: tuple):
    """A jitted ``() -> [zeros]`` for ``specs`` of (shape, dtype, sharding)."""
    return jax.jit(lambda: [jnp.zeros(shape, dtype) for shape, dtype, _ in specs],
                   out_shardings=[sharding for _, _, sharding in specs])
