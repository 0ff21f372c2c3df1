"""Capture: run a step's Python once under the lazy recorder and find its inputs and outputs.

Nothing here is a second tracer: the step runs on ordinary spmd tensors, every op is
recorded as on the lazy path, and :mod:`torchspmd.lazy.provenance` notes which storages
the step read and wrote. From that record:

- **inputs** are the data leaves of the recorded graph, each traced back to where it
  lives: an argument, a storage that existed before the step (a parameter, an optimizer
  moment, ``p.grad``...), or a constant the step made from host data;
- **outputs** are every pre-existing storage the step wrote (written back in place, so
  ``p`` stays ``p``), every slot the step filled with a new tensor (``p.grad`` after
  ``zero_grad()``), and the tensors it returned.

Example::

    result, captured, undo = capture(step, (x, y), {}, [x, y])
    captured.sources    # [("arg", 0), ("storage", <weakref>), ...] per graph leaf
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from torch.utils._pytree import tree_flatten

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy import provenance
from torchspmd.lazy.node import Node
from torchspmd.runtime.execute import sync, upload_leaf
from torchspmd.runtime.graph import Graph, collect
from torchspmd.step import optim
from torchspmd.step.places import Places, find_places


class RebindingError(RuntimeError):
    """A compiled step rebound a tensor that lives in a slot replays cannot write."""


@dataclass
class Captured:
    """What one recorded call read and wrote (see the module docstring).

    ``targets[i]`` says where output value ``values[i]`` goes: ``("storage", ref)``,
    ``("arg", k)``, ``("place", Place, template tensor)`` or ``("return", i)``.
    """

    graph: Graph | None
    sources: list  # per graph leaf: ("arg", k) | ("storage", weakref) | ("const", value)
    values: list  # output graph values, (node, index)
    targets: list
    result_spec: object
    result_leaves: list  # non-tensor results as they are; tensors replaced by None
    optimizers: list  # the optimizers the step reaches (their hyperparameters are checked)
    hyper: tuple = ()
    warmup: str = ""  # why this call cannot be replayed ("" when it can)
    substitutions: dict = field(default_factory=dict)  # output index -> source index
    held_by: dict = field(default_factory=dict)  # storage -> the slot that held it
    filled: dict = field(default_factory=dict)  # slot -> the new tensor the step put there
    # Preconditions of a replay: slots that must be empty (the step fills them), and
    # source index -> the slot whose tensor must still hold that source's storage.
    empty_places: list = field(default_factory=list)
    source_places: dict = field(default_factory=dict)


@dataclass
class Undo:
    """What a capture changed, to put back if the captured program then fails to compile
    or run: each storage the step wrote, with its value when the step began, and each
    slot the step filled, with the tensor it held (so a parameter is never left holding
    the pending value of a step that did not happen)."""

    values: dict = field(default_factory=dict)  # storage -> its value before the step
    slots: dict = field(default_factory=dict)  # Place -> the tensor (or None) before

    def apply(self) -> None:
        """Put every storage and slot back as it was before the step."""
        for storage, value in self.values.items():
            if storage.value is not value:
                storage.set(value)
        for place, tensor in self.slots.items():
            if place.get() is not tensor:
                place.set(tensor)


def capture(fn, args: tuple, kwargs: dict,
            tensors: list[SpmdTensor]) -> tuple[object, Captured, Undo]:
    """Run ``fn`` once, recording it; its result, what it read and wrote, and how to undo
    its writes."""
    sync()  # every live tensor now holds data: what the step reads are data leaves
    before = find_places(fn, args, kwargs)
    optim.prepare(before.optimizers)
    sync()
    before = find_places(fn, args, kwargs)
    arg_values = [t._h.storage.value for t in tensors]
    arg_storages = {t._h.storage: k for k, t in enumerate(tensors)}
    start = Node(None).seq  # nodes made from here on belong to the step
    with provenance.recording() as rec:
        result = fn(*args, **kwargs)
    after = find_places(fn, args, kwargs)
    _check_rebinding(before)
    undo = Undo({st: rec.initial[st] for st in rec.written
                 if st not in rec.created and st in rec.initial},
                {place: t for place, t in before.held.items() if after.held.get(place) is not t})
    flat, spec = tree_flatten(result)
    captured = Captured(None, [], [], [], spec, [None if isinstance(r, SpmdTensor) else r
                                                  for r in flat], after.optimizers,
                        optim.hyperparameters(after.optimizers))
    captured.warmup = _first_use(before, after)
    if captured.warmup:
        return result, captured, undo
    _outputs(captured, rec, before, after, flat, arg_storages)
    if captured.warmup:
        return result, captured, undo
    roots: dict[Node, set[int]] = {}
    for node, index in captured.values:
        if not node.is_leaf:
            roots.setdefault(node, set()).add(index)
    if roots:
        captured.graph = collect(sorted(roots, key=lambda n: n.seq), roots)
        _sources(captured, rec, arg_values, start)
    captured.filled = {}  # tensors are not kept past the capture
    return result, captured, undo


def _check_rebinding(before: Places) -> None:
    """A global or closure variable that held a tensor must hold it still."""
    for place, old in before.rebindable.items():
        if place.get() is not old:
            name = place.key if place.item else "a closure variable"
            raise RebindingError(
                f"torchspmd.compile: the step rebound {name!r}, which held a tensor before the "
                "step. A replay runs no Python, so the new tensor would be lost (the name "
                "would silently keep its old value). Update it in place (t.copy_(new), "
                "t.add_(x)), keep it as a module attribute or buffer, or return it from the "
                "step and assign it outside.")


def _first_use(before: Places, after: Places) -> str:
    """Why this call is a warm-up: a slot that did not exist before the step holds a tensor
    after it (optimizer state on first use); "" if there is none. (An existing empty slot
    that the step fills, ``p.grad`` after ``zero_grad()``, is an output instead.)"""
    for place, t in after.held.items():
        if t is not None and place not in before.held:
            return f"state created on first use ({place})"
    return ""


def _outputs(captured: Captured, rec, before: Places, after: Places, flat: list,
             arg_storages: dict) -> None:
    """Fill ``captured.values``/``targets``: written storages, filled slots, results."""
    held_by = {}
    for place, t in before.held.items():
        if t is not None and not t._h.view:
            held_by.setdefault(t._h.storage, place)
    for storage in rec.written:
        if storage in rec.created:
            continue
        k = arg_storages.get(storage)
        captured.values.append(storage.value)
        captured.targets.append(("arg", k) if k is not None else ("storage", weakref.ref(storage)))
    for place, t in after.held.items():
        old = before.held.get(place)
        if t is old or t is None:
            continue
        if t._h.storage not in rec.created:
            raise RebindingError(
                f"torchspmd.compile: the step moved an existing tensor into {place}; a compiled "
                "step can fill a slot only with a tensor it computes (use .clone())")
        captured.values.append(t._h.value())
        captured.targets.append(("place", place, (t.requires_grad, type(t))))
        if old is None:
            captured.empty_places.append(place)
        captured.filled[place] = t
    for i, r in enumerate(flat):
        if isinstance(r, SpmdTensor):
            captured.values.append(r._h.value())
            captured.targets.append(("return", i))
    captured.held_by = held_by


def _sources(captured: Captured, rec, arg_values: list, start: int) -> None:
    """Trace each graph leaf to where a replay reads it (by the data it held)."""
    for node, _ in captured.graph.leaves:
        if node.host is not None:  # host data (uploaded on first use): upload it now
            upload_leaf(node)
    by_array: dict[int, tuple] = {}
    for k, (node, index) in enumerate(arg_values):
        if node.arrays is not None:
            by_array.setdefault(id(node.arrays[index]), ("arg", k))
    for storage, (node, index) in rec.initial.items():
        if node.arrays is not None:
            by_array.setdefault(id(node.arrays[index]), ("storage", storage))
    for node, index in captured.graph.leaves:
        source = by_array.get(id(node.arrays[index]))
        if source is None:
            if node.seq < start:
                raise RuntimeError(
                    "torchspmd.compile: the step reads a tensor whose origin could not be "
                    f"traced (data of shape {node.sig.outputs[index].shape}); please report "
                    "this with the step's code")
            captured.sources.append(("const", (node, index)))
        elif source[0] == "storage":
            captured.sources.append(_storage_source(captured, source[1]))
        else:
            captured.sources.append(source)


def _storage_source(captured: Captured, storage) -> tuple:
    """A storage source. If a slot held it, replays check the slot still does; if the
    step put a new tensor in that slot (``p.grad`` rebound), later calls read the slot's
    new tensor instead."""
    place = captured.held_by.get(storage)
    if place is None:
        return ("storage", weakref.ref(storage))
    index = len(captured.sources)
    captured.source_places[index] = place
    new = captured.filled.get(place)
    if new is None:
        return ("storage", weakref.ref(storage))
    if new._h.view or new._h.storage.meta != storage.meta:
        captured.warmup = f"{place} changes form in the step"
    output = next(i for i, t in enumerate(captured.targets) if t[0] == "place" and t[1] == place)
    captured.substitutions[output] = index
    return ("storage", weakref.ref(new._h.storage))


def first_difference(old: Graph, new: Graph) -> str:
    """The first op where two recorded graphs differ, for ``check_every`` errors."""
    for i, (a, b) in enumerate(zip(old.nodes, new.nodes)):
        if a.sig.id != b.sig.id:
            return f"op {i}: captured {a.sig.op}, now {b.sig.op}"
    if len(old.nodes) != len(new.nodes):
        return f"the captured step had {len(old.nodes)} ops, now {len(new.nodes)}"
    return "the same ops, wired differently (inputs or outputs moved)"

