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
    captured.sources    # [ArgSource(0), StorageSource(<weakref>, slot), ...] per graph leaf
    captured.outputs    # [Output(value, StorageTarget(<weakref>)), ...] (``routes.py``)
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import dataclass, field

import torch

from torchspmd.device import index_checks
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy import provenance
from torchspmd.lazy.provenance import HostReadInStep
from torchspmd.lazy.node import Node
from torchspmd.runtime.execute import sync
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.transfer import upload_leaf
from torchspmd.runtime.graph import Graph, collect
from torchspmd.step import optim, outputs
from torchspmd.step.arguments import result_structure
from torchspmd.step.optim import NUMBERS
from torchspmd.step.places import MAX_DEPTH, Places, find_places
from torchspmd.step.undo import Undo
from torchspmd.step.unwalked import unwalked_slots
from torchspmd.step.side_effects import (HostStateError, PythonState, RebindingError,
                                         check_host_state, check_numbers, check_rebinding,
                                         first_binding)
from torchspmd.step.routes import (ArgSource, ConstSource, Output, RefilledSource, SlotTarget,
                                   Source, StorageSource)


@dataclass
class Captured:
    """What one recorded call read and wrote (see the module docstring): the graph, a
    :mod:`source <torchspmd.step.routes>` per graph leaf, and an :class:`Output` per value
    the step hands out."""

    graph: Graph | None
    sources: list[Source]
    outputs: list[Output]
    result_spec: object
    result_leaves: list  # non-tensor results as they are; tensors replaced by None
    optimizers: list  # the optimizers the step reaches (their hyperparameters are checked)
    hyper: tuple = ()
    warmup: str = ""  # why this call cannot be replayed ("" when it can)
    index_messages: list | None = None  # the step's index checks (``device/index_checks``)
    links: tuple = ()  # (Place, container): each must still hold it (``Places.links``)
    # (tensor, requires_grad) per walked parameter: freezing one changes the step
    grad_modes: tuple = ()
    # (an optimizer group's params list, its parameters then): one added changes the step
    group_params: tuple = ()
    # (module, training) when the step began: ``model.eval()`` outside changes the step
    modes: tuple = ()
    # (module, training) the step left changed (``model.train()`` inside it): a replay
    # sets them as the step's Python did
    mode_changes: tuple = ()
    # (weak reference, version) per CPU tensor the step took data from (a constant of
    # the program): one changed in place since makes the step capture again
    host_reads: tuple = ()
    # Returned tensors that share data with state outliving the step (``AliasReturn``)
    alias_returns: tuple = ()
    # The step returned tensors with autograd history and ran no backward
    # (``outputs.autograd_expected``)
    autograd_expected: bool = False
    # Slots that held a tensor when the step began and none when it ended
    # (``opt.zero_grad()`` at its end): a replay empties them too
    emptied: tuple = ()
    # (getter, value) per Python number the step may read (walked attributes and items,
    # globals, closure variables): one changed since makes the step capture again
    numbers: tuple = ()
    # The storages the step made (a WeakSet): alive once the call's own results are gone,
    # something the walk cannot see holds them (``hidden_tensors``)
    made: object = None
    # (source, weak reference to a storage): a storage the step read that held the same
    # data as that source when captured, so the graph reads both through the source
    aliases: list = field(default_factory=list)


def capture(fn, args: tuple, kwargs: dict,
            tensors: list[SpmdTensor]) -> tuple[object, Captured, Undo]:
    """Run ``fn`` once, recording it; its result, what it read and wrote, and how to undo
    its writes."""
    sync()  # every live tensor now holds data: what the step reads are data leaves
    lenders = find_places(fn, args, kwargs).optimizers
    optim.prepare(lenders, capturing=True)
    try:
        return _recorded(fn, args, kwargs, tensors)
    except BaseException:
        optim.give_back(lenders)  # the caller gives them back after a capture that ran
        raise


def _recorded(fn, args: tuple, kwargs: dict,
              tensors: list[SpmdTensor]) -> tuple[object, Captured, Undo]:
    """:func:`capture` once its optimizers are prepared."""
    sync()
    before = find_places(fn, args, kwargs)
    _upload_host_data(before)
    arg_values = [t.handle.storage.value for t in tensors]
    python_state = PythonState.of(before)
    start = Node(None).seq  # nodes made from here on belong to the step
    backward_calls = COUNTERS["backward_calls"]
    with provenance.recording() as rec, _traced_as_by_torch_compile():
        outer = index_checks.take_flag()
        try:
            result = fn(*args, **kwargs)
            flag = index_checks.take_flag()
        except _REFUSALS:
            # A read on the host, a rebinding: torchspmd's refusals, which an eager run
            # would not meet. The step did not happen: what it changed so far goes back.
            Undo.of(rec, before, find_places(fn, args, kwargs), python_state).apply()
            raise
        finally:
            index_checks.restore_flag(outer)
    # The step's index-range flag is one more result: ``CompiledStep`` takes it off again.
    result = (result, None if flag is None else flag.tensor)
    after = find_places(fn, args, kwargs)
    undo = Undo.of(rec, before, after, python_state)
    arg_storages = {t.handle.storage: k for k, t in enumerate(tensors)}
    # A refusal found here (a Python value or host state the step changed, a tensor it
    # moved between slots): the whole step ran, then was refused, so it is undone.
    try:
        python_state.check()
        check_rebinding(before)
        check_numbers(before)
        check_host_state(before)
        held_by = _held_by(before)
        held_by.update(_unwalked(fn, args, kwargs, after, rec, held_by, arg_storages))
        flat, spec = result_structure(result)
        captured = Captured(None, [], [], spec, [None if isinstance(r, SpmdTensor) else r
                                                 for r in flat], after.optimizers,
                            optim.hyperparameters(after.optimizers))
        captured.index_messages = None if flag is None else flag.messages
        captured.links = tuple(after.links.items())
        captured.grad_modes = tuple((t, t.requires_grad) for t in after.held.values()
                                    if isinstance(t, torch.nn.Parameter) or (
                                        t is not None and t.requires_grad))
        captured.modes = tuple(before.modes)
        began = {id(module): training for module, training in before.modes}
        captured.mode_changes = tuple((module, training) for module, training in after.modes
                                      if began.get(id(module), training) != training)
        captured.group_params = tuple(after.group_params)
        captured.host_reads = tuple(rec.host_reads)
        captured.emptied = tuple(place for place, t in after.held.items()
                                 if t is None and before.held.get(place) is not None)
        captured.warmup = _first_use(before, after) or first_binding(before)
        captured.autograd_expected = outputs.autograd_expected(
            flat, COUNTERS["backward_calls"] != backward_calls)
        captured.made = rec.created
        captured.numbers = tuple((place.getter(), value) for place, value in (
            *before.numbers.items(),
            *((p, v) for p, v in before.rebindable.items() if type(v) in NUMBERS)))
        if not captured.warmup:
            filled = outputs.route(captured, rec, before, after, flat, arg_storages,
                                   tensors)
            _graph(captured, _Read(rec, arg_values, arg_storages, start, held_by, filled))
    except _REFUSALS:
        undo.apply()  # as if the step had not run
        raise
    # A capture whose program then fails puts back its tensors only (the state a
    # warm-up made is the call's).
    return result, captured, undo.tensors_only()


# What torchspmd refuses in a step (an eager run would not raise them).
_REFUSALS = (HostReadInStep, RebindingError, HostStateError)


@contextlib.contextmanager
def _traced_as_by_torch_compile():
    """``torch.compiler.is_compiling()`` is true while a step is captured, as while
    ``torch.compile`` traces: libraries then take their paths without host reads, which a
    capture cannot do either (``torch.optim``'s ``_get_value`` keeps a step count a tensor;
    Hugging Face's attention masks skip checking on the host whether padding is all ones).
    Nothing happens where this PyTorch keeps the flag elsewhere. (PyTorch 2.13 wraps the
    same lines as ``torch.compiler._compile_session_context``; older versions may have
    the flag without it.)"""
    compiler = torch.compiler
    if not isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        yield
        return
    old = compiler._is_compiling_flag
    compiler._is_compiling_flag = True
    try:
        yield
    finally:
        compiler._is_compiling_flag = old


@dataclass(frozen=True)
class _Read:
    """What tracing the graph's leaves to their sources needs from the capture: the
    recording, the arguments' values, the first node of the step, which walked slot held
    each storage before the step, and the new tensor the step put in each slot."""

    rec: provenance.StorageTouches
    arg_values: list
    arg_storages: dict  # each argument's storage -> its position
    start: int
    held_by: dict  # storage -> Place
    filled: dict  # Place -> new tensor


def _graph(captured: Captured, read: _Read) -> None:
    """The graph computing the step's outputs, and the source of each of its leaves."""
    roots: dict[Node, set[int]] = {}
    for output in captured.outputs:
        node, index = output.value
        if not node.is_leaf:
            roots.setdefault(node, set()).add(index)
    if roots:
        captured.graph = collect(sorted(roots, key=lambda n: n.seq), roots)
        captured.sources = _sources(captured, read)


def _held_by(before: Places) -> dict:
    """The walked slot that held each storage before the step, as a whole tensor (a base,
    or a chain of identity views: an ``nn.Parameter`` over a tensor)."""
    held_by = {}
    for place, t in before.held.items():
        if t is not None and t.handle.whole:
            held_by.setdefault(t.handle.storage, place)
    return held_by


def _upload_host_data(places: Places) -> None:
    """State still holding the CPU data it was made from goes to the devices now, as it
    would when first read: a step may also hand that data to another tensor (``copy_``
    from an annotated tensor makes a new leaf over it), which must be the same device
    data for the replay to find its source."""
    for t in (*places.held.values(), *places.rebindable.values()):
        if isinstance(t, SpmdTensor) and t.handle.whole:
            node = t.handle.storage.value[0]
            if node.host is not None:
                upload_leaf(node)


def _unwalked(fn, args: tuple, kwargs: dict, after: Places, rec, held_by: dict,
              arg_storages: dict) -> dict:
    """The slots :func:`find_places` does not list (beyond its depth, under a module's
    ``_`` attribute) that hold a tensor the step read, by storage: replays check them as
    they check walked slots. A tensor the step made must not stay in such a slot: a
    replay runs no Python and would leave this call's tensor there for good."""
    made = set(rec.created)  # the storages the step made that are still alive
    unheld = {st for st in rec.initial if st not in held_by and st not in arg_storages}
    if not made and not unheld:
        return {}
    found = unwalked_slots(fn, args, kwargs, after, lambda t: t.handle.storage in made or (
        not t.handle.view and t.handle.storage in unheld))
    for place, name in found:
        if place.get().handle.storage in made:
            raise RebindingError(
                f"torchspmd.compile: the step put a new tensor in {name}, a slot a compiled "
                f"step does not track (it finds slots within {MAX_DEPTH} levels of the "
                "step's arguments, closure and globals, and not under a module's attributes "
                "that start with '_'). A replay runs no Python, so that slot would keep this "
                "call's tensor. Keep the tensor in a tracked slot (a module attribute or "
                "buffer, optimizer state, a dict or list fewer levels deep), update a tensor "
                "there in place (t.copy_(new)), or return it from the step.")
    return {place.get().handle.storage: place for place, _ in reversed(found)}


def _first_use(before: Places, after: Places) -> str:
    """Why this call is a warm-up: a slot that did not exist before the step holds a tensor
    after it (optimizer state on first use); "" if there is none. (An existing empty slot
    that the step fills, ``p.grad`` after ``zero_grad()``, is an output instead.)"""
    for place, t in after.held.items():
        if t is not None and place not in before.held:
            return f"state created on first use ({place})"
    return ""


def _sources(captured: Captured, read: _Read) -> list[Source]:
    """Trace each graph leaf to where a replay reads it (by the data it held)."""
    for node, _ in captured.graph.leaves:
        if node.host is not None:  # host data (uploaded on first use): upload it now
            upload_leaf(node)
    # A leaf is found by its value (node and output), which the argument or storage held
    # when the step began; else by its array. Storages the step read come first.
    by_value: dict[tuple[int, int], Source] = {}
    by_array: dict[int, Source] = {}
    # The other storages the step read that held the value of a source: one leaf for all
    # (a zero-copy ``copy_`` shares a value), each replay checks they still hold what the
    # source holds (``Plan.inputs``); one changed by hand since, the step must read it apart.
    # An argument's own storage is no other: the next call passes another tensor there.
    sharers: dict[tuple[int, int], list] = {}
    rec = read.rec
    held = [(value, ArgSource(k)) for k, value in enumerate(read.arg_values)]
    held += [(rec.initial[s], s)
             for s in (*rec.read, *(s for s in rec.initial if s not in rec.read))]
    for (node, index), holder in held:
        if node.arrays is not None:
            key = (id(node), index)
            if (by_value.setdefault(key, holder) is not holder and holder in rec.read
                    and holder not in read.arg_storages):
                sharers.setdefault(key, []).append(holder)
            by_array.setdefault(id(node.arrays[index]), holder)
    sources: list[Source] = []
    for node, index in captured.graph.leaves:
        captured.aliases += [(len(sources), weakref.ref(storage))
                             for storage in sharers.get((id(node), index), ())]
        source = by_value.get((id(node), index))
        if source is None:
            source = by_array.get(id(node.arrays[index]))
        if source is None:
            if node.seq < read.start:
                raise RuntimeError(
                    "torchspmd.compile: the step reads a tensor whose origin could not be "
                    f"traced (data of shape {node.sig.outputs[index].shape}); please report "
                    "this with the step's code")
            sources.append(ConstSource((node, index)))
        elif isinstance(source, ArgSource):
            sources.append(source)
        else:
            sources.append(_storage_source(captured, read, source))
    return sources


def _storage_source(captured: Captured, read: _Read, storage) -> Source:
    """The source of a storage the step read. If a walked slot held it, replays check the
    slot still does; if the step put a new tensor in that slot (a module attribute
    rebound), each later call reads the slot's new tensor instead."""
    place = read.held_by.get(storage)
    new = read.filled.get(place) if place is not None else None
    if new is None:
        return StorageSource(weakref.ref(storage), place)
    if new.handle.view or new.handle.storage.meta != storage.meta:
        captured.warmup = f"{place} changes form in the step"
    output = next(j for j, o in enumerate(captured.outputs)
                  if isinstance(o.target, SlotTarget) and o.target.slot == place)
    return RefilledSource(place, output, weakref.ref(new.handle.storage))


def hidden_tensors(captured: Captured) -> int:
    """How many tensors the step made are still alive once the first run has put its own
    tensors in every slot and result: something the walk cannot see holds them (a helper
    function's global, an object beyond the walk's types). A replay runs no Python and
    would never update them, so such a capture is not kept. Called after the capture's
    own references are dropped; a garbage collection first, only if any seem alive
    (reference cycles)."""
    made = captured.made
    if made is None or not len(made):
        return 0
    gc.collect()
    return len(made)


def first_difference(old: Graph, new: Graph) -> str:
    """The first op where two recorded graphs differ, for ``check_every`` errors."""
    for i, (a, b) in enumerate(zip(old.nodes, new.nodes)):
        if a.sig.id != b.sig.id:
            return f"op {i}: captured {a.sig.op}, now {b.sig.op}"
    if len(old.nodes) != len(new.nodes):
        return f"the captured step had {len(old.nodes)} ops, now {len(new.nodes)}"
    return "the same ops, wired differently (inputs or outputs moved)"

