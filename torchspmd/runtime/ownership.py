"""Buffer ownership: who else holds a buffer that a program could take over.

A program may consume an input buffer and write its outputs into it (donation): state
updated in place at the lazy ``sync()`` and by compiled steps, and the old gradients a
compiled step replaces (recycled gradients). Afterwards the buffer is deleted. This
module alone answers "does anyone else hold this buffer?"; ``donation.py`` and
``step/recycle.py`` ask it, and it keeps the record of arrays over shared buffers.

The contract:

- A holder is anything that could still read the buffer: a tensor whose value it is,
  through any reference to it (a Python name, a list or dict, a closure cell, an
  attribute, a C++ holder such as autograd's saved tensors or a ``.grad`` slot, or a
  weak reference to a tensor that would otherwise be kept and given a new value); a
  view or ``detach()`` of such a tensor (they share its storage); a pending computation
  that reads it; another ``jax.Array`` over the same device buffers.
- What torchspmd makes itself, it tracks: arrays over shared buffers are noted here
  (:func:`note_shared`, held weakly); a sync's graph names every operand of its pending
  nodes; the in-flight lists are passed in (``flying``). What it cannot see, a plain
  Python reference to a tensor or to an object under it, shows in reference counts:
  each object on the path tensor -> handle -> storage -> value -> node -> array must
  have exactly the references that torchspmd's own structures and this module's own
  local names give it. Fewer counts as unknown too: nothing is donated.
- Reference counts are the interpreter's (CPython 3.14 borrows references on its
  stack; free-threaded builds defer counts). So at import ``ownership_check.calibrate`` asks every
  question below of objects whose holders are known, through the very same functions:
  one held by no one else, and one with a hidden holder at each step of the path. If
  any answer is wrong, the interpreter counts differently: donation is off for the
  process. Nothing is then donated or recycled, every refusal adds one to
  ``metrics()["donation_disabled"]``, and ``COUNTING.reason`` says why. Results stay
  right; only the memory saved by donation is lost.

Example::

    alone = exclusive(values, arrays, indices, flying)   # compiled step: per donated input
    positions = unheld_leaves(graph, inputs, flying)     # lazy sync: leaves none can read
    array, kept = sole_gradient(slot)                    # a .grad only its slot holds
    COUNTING.ok, COUNTING.reason                         # (True, "") on CPython 3.11
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from torchspmd.runtime.graph import Graph
from torchspmd.runtime.metrics import COUNTERS

__all__ = ["COUNTING", "Counting", "GradientSlot", "exclusive", "note_shared",
           "shares_buffers", "sole_gradient", "unheld_leaves"]

# Replaced by tests to play an interpreter that counts differently.
_getrefcount: Callable[[Any], int] = getattr(sys, "getrefcount", None)


@dataclass
class Counting:
    """Whether reference counts answer ownership here: ``ok``, else ``reason`` (why not).

    ``base`` is what ``sys.getrefcount`` reports beyond an object's real holders when it
    is passed as a local name (2 - 1 on CPython 3.11: its own argument).
    """

    ok: bool = False
    reason: str = "not calibrated"
    base: int = 0


# The registry of this process's answer (set by ``ownership_check.calibrate`` at import).
COUNTING = Counting()


def _refused() -> None:
    COUNTERS["donation_disabled"] += 1


# --- tracked holders: arrays over shared buffers ------------------------------------------

# id(array) -> (a weak reference to it, weak references to arrays sharing its buffers).
# Arrays are unhashable, so they are keyed by id; the entry goes when the array does.
_SHARED: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}


def note_shared(a, b, check: bool = True) -> None:
    """Record that arrays ``a`` and ``b`` may hold the same device buffers (with ``check``,
    only if some device buffer of one is one of the other's).

    Moving data without copying (a replicated array lending its buffers to a sub-mesh, a
    relabeled device order, a ``device_put`` JAX satisfies with the same buffers) gives
    two arrays over one buffer; donating either deletes it under both. Sharing is
    transitive: ``b`` also shares with every live array ``a`` shares with.

    Example: ``b = jax.device_put(a, sub_mesh); note_shared(a, b); shares_buffers(a)``.
    """
    if a is b or (check and not _overlap(a, b)):
        return
    group = [a, b, *_partners(a), *_partners(b)]
    members = list({id(x): x for x in group}.values())
    for x in members:
        entry = _SHARED.get(id(x))
        if entry is None or entry[0]() is not x:
            entry = _SHARED[id(x)] = (weakref.ref(x, _forget(id(x))), [])
        entry[1][:] = [weakref.ref(y) for y in members if y is not x]


def shares_buffers(array, ignore=None) -> bool:
    """Whether another live array (other than ``ignore``) may hold ``array``'s buffers.

    Example: ``shares_buffers(a)`` is True while an array ``note_shared`` paired with
    ``a`` lives.
    """
    if id(array) not in _SHARED:  # most arrays: asked of every donation candidate
        return False
    return any(y is not ignore for y in _partners(array))


def _partners(array) -> list:
    entry = _SHARED.get(id(array))
    if entry is None or entry[0]() is not array:
        return []
    return [y for y in (r() for r in entry[1]) if y is not None]


def _forget(key: int):
    def callback(ref: weakref.ref) -> None:
        entry = _SHARED.get(key)
        if entry is not None and entry[0] is ref:
            del _SHARED[key]
    return callback


def _overlap(a, b) -> bool:
    try:
        mine = {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}
        return any(s.data.unsafe_buffer_pointer() in mine for s in b.addressable_shards)
    except Exception:  # noqa: BLE001  (a layout without plain pointers: assume shared)
        return True


# --- the questions ------------------------------------------------------------------------
# Each reads reference counts of its own local names only (a caller's locals would count
# differently on each call site); ``getrefcount(x) == base + holders``, the local counted.


def exclusive(values: list, arrays: list, indices: list[int], flying: set[int]) -> list[bool]:
    """For each of ``indices``: whether the state value ``values[i]`` (held by its storage)
    and its array ``arrays[i]`` have no holder but that storage, so a compiled step that
    overwrites the storage may take the buffer.

    Example: ``exclusive([storage.value], [array], [0], set()) == [True]``.
    """
    if not COUNTING.ok:
        _refused()
        return [False] * len(indices)
    rc, base = _getrefcount, COUNTING.base
    two, three = base + 2, base + 3  # ``getrefcount`` of 2 and 3 holders
    alone = []
    for i in indices:
        value = values[i]
        node = value[0]
        array = arrays[i]
        # Holders: of the value, its storage, ``values`` and the local; of the node, the
        # value and the local; of the array, ``node.arrays``, ``arrays``, the local, and
        # the in-flight list if it is there.
        alone.append(rc(value) == three and rc(node) == two
                     and rc(array) == three + (id(array) in flying)
                     and not shares_buffers(array))
    return alone


def unheld_leaves(graph: Graph, inputs: list, flying: set[int]) -> list[int]:
    """The positions in ``graph.leaves`` (and ``inputs``, their placed arrays) that no one
    can read once ``graph`` has run: only its pending nodes read the leaf (its tensor
    now holds this run's output, or was dropped) and its array belongs to it alone.

    If a pending node of the graph is held from outside (a stale view, an intermediate
    something else still needs), it may run again later and read its inputs: then none.
    Example: after ``p.add_(1)``, ``unheld_leaves(graph, inputs, set())`` names p's leaf.
    """
    if not COUNTING.ok:
        _refused()
        return []
    rc, base = _getrefcount, COUNTING.base
    one, two, three = base + 1, base + 2, base + 3  # ``getrefcount`` of 1, 2, 3 holders
    # References each value tuple gets from inside the graph: the nodes' inputs tuples
    # and ``graph.leaves``. Anything beyond them is a holder outside this run. Plain
    # dicts, not Counters: a Counter's missing key is a Python call, and this runs over
    # every operand of every sync.
    internal: dict[int, int] = {}
    tuples: dict[int, tuple] = {}
    for node in graph.nodes:
        for value in node.inputs:
            key = id(value)
            internal[key] = internal.get(key, 0) + 1
            tuples[key] = value
    for value in graph.leaves:
        key = id(value)
        internal[key] = internal.get(key, 0) + 1
    # Per node: how many distinct value tuples that only the graph holds refer to it.
    # Keyed by the nodes themselves (they hash by identity, in C).
    held: dict = {}
    outside: set = set()
    value = node = leaf = array = placed = None  # the loops' locals, counted below
    for value in tuples.values():
        # Holders: ``tuples``, the local, and the graph's.
        if rc(value) == two + internal[id(value)]:
            node = value[0]
            held[node] = held.get(node, 0) + 1
        else:
            outside.add(value[0])
    value = node = None
    roots = set(graph.roots)
    for node in graph.nodes:
        if node in roots:
            continue  # becomes a leaf holding its outputs: it reads no input again
        # Holders: ``graph.nodes``, the local, ``held``'s key and its tuples.
        if node in outside or rc(node) != three + held.get(node, 0):
            return []
    node = None
    found = []
    # Indexed, not zipped: zip and enumerate keep their last item, one more reference.
    for position in range(len(graph.leaves)):
        leaf, index = graph.leaves[position]
        placed = inputs[position]
        if leaf.arrays is None or leaf in outside:
            continue
        array = leaf.arrays[index]
        # Holders of the array: ``leaf.arrays``, the local, the in-flight list if there,
        # and if it was placed as it is, ``inputs`` and ``placed``. An array placed anew
        # over the same devices is the same buffers relabeled (donating it deletes the
        # original too, which no one reads); one placed on other devices may lend only
        # some of them: kept.
        if placed is array:
            array_refs = base + 4
        elif placed.sharding.device_set == array.sharding.device_set:
            array_refs = two
            if rc(placed) != two:  # ``inputs`` and ``placed``
                continue
        else:
            continue
        # Holders of the leaf: its tuples, the local, ``held``'s key if there.
        if (rc(leaf) == one + (leaf in held) + held.get(leaf, 0)
                and rc(array) == array_refs + (id(array) in flying)
                and not shares_buffers(array, ignore=placed)):
            found.append(position)
    return found


@dataclass(frozen=True, slots=True)
class GradientSlot:
    """A ``.grad`` slot a compiled step refills, as :func:`sole_gradient` reads it."""

    get: Callable[[], Any]  # the tensor in the slot (or None)
    clear: Callable[[], None]  # empties the slot
    handle_of: Callable[[Any], Any]  # a tensor's lazy handle if it is a base, else None
    usable: Callable[[Any], bool]  # whether an array can take the new gradient
    keeps: type  # the exact type of a tensor that may stay in its slot


def sole_gradient(slot: GradientSlot) -> tuple[Any, Any]:
    """The old gradient's array, if nothing but ``slot`` holds it (else None), and the old
    gradient tensor if it may even stay in the slot and take the new value (else None).

    A tensor stays when nothing else holds it (no other reference, weak reference, or C++
    holder such as a graph that saved it for backward) and it is what a new gradient
    would be (of type ``slot.keeps``, no grad): no one can tell it from a new tensor.
    Otherwise the slot is emptied, and the array is given if the tensor then died.
    Example: ``array, kept = sole_gradient(slot)``.
    """
    if not COUNTING.ok:
        _refused()
        return None, None
    rc, base = _getrefcount, COUNTING.base
    two = base + 2  # ``getrefcount`` of 2 holders
    old = slot.get()
    handle = slot.handle_of(old)
    if handle is None:
        return None, None
    storage = handle.storage
    value = storage.value
    node = value[0]
    array = node.arrays[value[1]] if node.arrays is not None else None
    if array is None or not slot.usable(array):
        return None, None
    # Holders of the tensor: its Python object's owner (the slot's C++ reference makes
    # the object live) and the local; ``use_count``: the slot and the Python object. Of
    # the handle, storage, value, node and array: the one above each, and the local.
    if (type(old) is slot.keeps and not old.requires_grad and old._use_count() == 2
            and rc(old) == two and not weakref.getweakrefcount(old)
            and rc(handle) == two and rc(storage) == two
            and rc(value) == two and rc(node) == two
            and rc(array) == two and not shares_buffers(array)):
        return array, old
    alive = weakref.ref(old)
    slot.clear()
    del old, handle, storage
    # Once the tensor is gone: the value has the local; the node, the value and the
    # local; the array, ``node.arrays`` and the local.
    if (alive() is not None or rc(value) != base + 1 or rc(node) != two
            or rc(array) != two or shares_buffers(array)):
        return None, None
    return array, None
