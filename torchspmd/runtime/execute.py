"""sync: compile (or find in the cache) and run the pending graph; results become data.

Independent computations of one graph run where their own inputs and annotations place
them (``placement``), as one program per device set. A program that cannot fit in device
memory is refused before it runs (``memory``). A program that fails to compile or run
fails alone: its independent computations are retried one by one, and the values of each
that fails again raise its error when read (``failure``); everything else stays usable.
"""

from __future__ import annotations

import gc
import weakref

import jax
import torch

from torchspmd.jax_setup import devices
from torchspmd.lazy.handle import PENDING, PENDING_VIEWS
from torchspmd.lazy.node import Node
from torchspmd.lazy.provenance import is_recording, refuse_host_read
from torchspmd.runtime import hooks, manual_regions, memory, placement, transfer
from torchspmd.runtime.donation import lazy_donations
from torchspmd.runtime.failure import FailedValue, is_failed, mark_failed
from torchspmd.runtime.cache import LRU, programs_capacity_from_env
from torchspmd.runtime.graph import collect
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.parts import Parts
from torchspmd.runtime.program import Program

# The compile cache (a registry the design names): graph key -> Program, bounded (LRU).
_PROGRAMS = LRU(programs_capacity_from_env(), evictions="programs_evicted")
# A program's graph's independent computations (``Parts``), kept while the program is.
_PARTS: "weakref.WeakKeyDictionary[Program, Parts]" = weakref.WeakKeyDictionary()
# The latest program run, for debug.last_hlo() / debug.collectives().
_LAST: list[Program] = []
# The latest run's outputs per device set: a device runs programs in order, so waiting
# for these waits for everything before them (and holds no older step's buffers).
_IN_FLIGHT: dict[frozenset, list] = {}
# What the latest runs consumed (donated arrays, old values, a lazy run's graph): freed
# when the host next waits for the devices, or before the next run at the latest.
# Freeing costs host time (~4 µs per donated 8-shard array); before a launch it delays
# the launch, while the host waits for the devices it delays nothing.
_SPENT: list = []


def sync(wait: bool = False) -> None:
    """Compile and run every live tensor's pending graph.

    Independent computations run where their own inputs and annotations place them: one
    program per device set (a training step on one mesh is one program).

    Example::

        loss = model(x).sum(); loss.backward(); opt.step()
        torchspmd.sync()   # one compiled program for the whole step

    Inside a step being recorded by ``torchspmd.compile`` it does nothing: the whole
    step is one program.
    """
    if is_recording():
        return
    storages, views, values = take_pending()
    try:
        _compute(storages, values)
        mixed = False
    except placement.MeshMismatchError:
        mixed = True  # out of the handler: its traceback holds the pending values
    if mixed:
        # Nothing that mixes device sets ran. It may be the work of tensors already
        # dropped but not yet collected (held by a reference cycle: an exception's
        # traceback, say), whose graphs are never to run (the pending sets are weak for
        # that): collect those, and run what live tensors still need.
        PENDING.update(storages)
        PENDING_VIEWS.update(views)
        del storages, views, values
        gc.collect()
        storages, _, values = take_pending()
        _compute(storages, values)
    if wait:
        wait_device_ops()
    hooks.after_run(blocking=wait)


def _compute(storages: list, values: list) -> None:
    """Run the graph of the pending ``values`` taken with ``storages``."""
    wanted = wanted_outputs(values)
    execute(sorted(wanted, key=lambda n: n.seq), wanted, successors(storages))


def take_pending() -> tuple[list, list, list[tuple[Node, int]]]:
    """Empty the pending sets: the storages and views taken (so that a run that fails can
    put them back) and their pending values, which one run must now compute."""
    storages, views = PENDING.take(), PENDING_VIEWS.take()
    values = [s.value for s in storages] + [h.pending_view_value() for h in views]
    local = manual_regions.local_blocks(values)
    if any(local):
        # Local blocks of a manual region a live tensor still holds stay pending (their
        # region's global results are computed; the blocks are no value of their own).
        of_views = local[len(storages):]
        PENDING.update(s for s, block in zip(storages, local) if block)
        PENDING_VIEWS.update(h for h, block in zip(views, of_views) if block)
        storages = [s for s, block in zip(storages, local) if not block]
        views = [h for h, block in zip(views, of_views) if not block]
        values = [v for v, block in zip(values, local) if not block]
    return storages, views, values


def successors(storages: list) -> dict:
    """For the storages taken from the pending set: the data each held before its value
    became pending, as ``(node.seq, index)``, mapped to that pending value (the output
    that should take over its buffer, see ``execute``)."""
    return {s.origin: s.value for s in storages if s.origin is not None}


def wanted_outputs(values: list) -> dict[Node, set[int]]:
    """The nodes computing ``values`` (data and ``None`` skipped), each with the outputs
    wanted of it: the roots and ``wanted`` of :func:`execute`."""
    wanted: dict[Node, set[int]] = {}
    for value in values:
        if value is not None and not value[0].is_leaf:
            wanted.setdefault(value[0], set()).add(value[1])
    return wanted


def set_compile_cache_size(programs: int) -> None:
    """Keep at most ``programs`` compiled programs (least recently used go first).

    The default is 256, or ``TORCHSPMD_COMPILE_CACHE_SIZE``; ``metrics()["programs_evicted"]``
    counts the programs dropped. A dropped program is compiled again if its graph recurs
    (``TORCHSPMD_COMPILATION_CACHE=DIR`` keeps XLA's executables on disk to make that fast).

    Example::

        torchspmd.set_compile_cache_size(64)
    """
    _PROGRAMS.capacity = programs


def _leaf_sharding(leaf: Node, index: int):
    """Where leaf data is or will be: its arrays' layout, or a host leaf's annotation."""
    if leaf.host is not None:
        return leaf.sharding  # None: uploaded replicated on every device
    return _array(leaf, index).sharding


def _placements(graph, parts: Parts) -> list[tuple[tuple[int, ...] | None, list[int]]]:
    """Each device set the graph's computations run on, with the roots (indices) there.

    ``None`` is all devices. Raises ``MeshMismatchError`` for one computation that mixes
    two device sets.
    """
    groups: dict = {}
    for roots, leaves, constraints in zip(parts.roots, parts.leaves, parts.annotations):
        # Distinct objects only: a step's leaves share a few shardings, and comparing
        # each against the device set hashes it (Python code in JAX).
        distinct = {}
        for i in leaves:
            s = _leaf_sharding(*graph.leaves[i])
            if s is not None:
                distinct[id(s)] = s
        shardings = list(distinct.values())
        target = placement.target_devices(shardings, constraints)
        groups.setdefault(target, []).extend(roots)
    return list(groups.items())


def materialize(values: list[tuple[Node, int]]) -> list[jax.Array]:
    """The arrays of ``values``, running just the graph they need."""
    refuse_host_read("an op that needs a computed value now (a data-dependent shape, a "
                     "host transfer)")
    pending = list(dict.fromkeys(n for n, _ in values if not n.is_leaf))
    execute(pending)
    result = []
    for node, index in values:
        if node.host is not None:
            upload_leaf(node)
        result.append(_array(node, index))
    return result


def _array(node: Node, index: int) -> jax.Array:
    array = node.arrays[index]
    if array is None:  # sync() returns only outputs live tensors hold: this one had none
        raise RuntimeError(f"torchspmd internal error: output {index} of {node.sig.op} was "
                           "not kept by sync(); please report this with the code that reads it")
    if type(array) is FailedValue:
        array.raise_error()
    return array


def execute(roots: list[Node], wanted: dict | None = None, successors: dict | None = None) -> None:
    """Run the graph of ``roots``; afterwards each root is a leaf holding its arrays.

    Independent computations on different device sets run as one program each.
    ``successors`` maps a data value, as ``(node.seq, index)``, to the pending value that
    replaces it in its tensor: the output that should take over its buffer if donated.
    """
    if not roots:
        return
    release_spent()  # the last run's graph: before donation counts references
    graph = collect(roots, wanted)
    try:
        _run(graph, wanted, successors)
        return
    except _LaunchFailed as launch:
        failure = _isolate(graph, launch.error, wanted, successors)
    except Exception:
        read = next((leaf.arrays[i] for leaf, i in graph.leaves
                     if leaf.arrays is not None and is_failed(leaf.arrays[i])), None)
        if read is None:
            raise  # nothing ran (a mesh mismatch, say): the work stays as it was
        # It reads a value a failed step was to compute: it fails with that step.
        failure = _isolate(graph, read, wanted, successors)
    if is_failed(failure):
        failure.raise_error()
    if failure is not None:
        raise failure from None


class _LaunchFailed(Exception):
    """Internal: ``Program.run`` raised ``error`` (the program failed to compile or run)."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def _isolate(graph, error, wanted, successors):
    """After ``graph`` failed with ``error`` (or a :class:`FailedValue` it read): run each
    of its independent computations alone, and make the roots of each one that fails
    again leaves that raise its error (``failure``). Returns what to raise: the first
    computation's error that failed, ``error`` if there is one computation, or None if
    each ran alone."""
    parts = Parts(graph)
    if len(parts.roots) > 1:
        first = None
        for indices in parts.roots:
            try:
                execute([graph.roots[i] for i in indices if not graph.roots[i].is_leaf],
                        wanted, successors)
            except Exception as part_error:  # noqa: BLE001  (the others still run)
                first = first or part_error
        if first is not None:
            return first
    mark_failed(graph.roots, error if is_failed(error) else FailedValue(error))
    return error


def _run(graph, wanted: dict | None, successors: dict | None) -> None:
    """The body of :func:`execute`: a failure of ``Program.run`` comes as _LaunchFailed."""
    roots = graph.roots
    program = _PROGRAMS.get(graph.key)
    if program is not None:
        COUNTERS["cache_hits"] += 1
    known = _LAYOUTS.get(program) if program is not None else None
    inputs = _as_last_time(graph, known) if known is not None else None
    if inputs is not None:
        target = known[1]
    else:
        parts = _PARTS.get(program) if program is not None else None
        if parts is None:
            parts = Parts(graph)
        placements = _placements(graph, parts)
        if len(placements) > 1:
            failure = None
            for _, indices in placements:
                try:
                    execute([graph.roots[i] for i in indices], wanted, successors)
                except Exception as error:  # noqa: BLE001  (the other device sets still run)
                    failure = failure or error
            if failure is not None:
                raise failure
            return
        target = placements[0][0] if placements else None
        inputs = _placed_inputs(graph, target)
        if program is None:
            program = _PROGRAMS[graph.key] = Program(graph)
            _PARTS[program] = parts
        _note_layouts(program, graph, inputs, target)
    # Leaves only this run reads (state it overwrites) give their buffers to it.
    donate = lazy_donations(graph, inputs, in_flight_ids(), program.output_avals)
    if donate:
        COUNTERS["donated_bytes"] += _donated_bytes(program, inputs, donate)
    ids = target if target is not None else tuple(range(len(devices())))
    try:
        outputs = program.run(graph, inputs, donate, ids,
                              _paired_outputs(graph, donate, successors))
    except Exception as error:
        if not isinstance(error, torch.OutOfMemoryError) and memory.is_out_of_memory(error):
            error = memory.out_of_memory(graph, f"XLA could not allocate its memory ({error})")
        raise _LaunchFailed(error) from None
    _LAST[:] = [program]
    # The graph that ran (its nodes, and leaves with their spent or donated arrays) is
    # torn down later, not while the program runs: freeing it now would compete with
    # the program for the host's cores (see ``_SPENT``).
    release_later([root.inputs for root in graph.roots])
    several = len(ids) > 1
    for root, indices, arrays in zip(graph.roots, graph.wanted, outputs):
        full = [None] * len(root.sig.outputs)
        for i, a in zip(indices, arrays):
            # _on_devices, its test inline (a call per output costs more than the test)
            full[i] = (_on_devices(a, ids) if several and isinstance(a.sharding, _SINGLE)
                       else a)
        root.materialized(full)
    note_in_flight([a for arrays in outputs for a in arrays])


def _paired_outputs(graph, donate: tuple[int, ...], successors: dict | None) -> tuple:
    """For each donated leaf position, the output (root position, position in its group)
    that replaces it in its tensor, or None: JAX gives a donated buffer to the first
    output of its shape still without one, so the program lists these first (else a
    parameter's buffer may go to another parameter's new value while it is still to be
    read, and XLA copies the parameter first)."""
    if not donate or not successors:
        return ()
    # Roots by position (nodes hash by identity, in C); most roots have one output wanted.
    where = {root: r for r, root in enumerate(graph.roots)}
    wanted, leaves = graph.wanted, graph.leaves
    pairs, taken = [], set()
    for position in donate:
        leaf, index = leaves[position]
        successor = successors.get((leaf.seq, index))
        pair = None
        if successor is not None:
            r = where.get(successor[0])
            if r is not None and successor[1] in wanted[r]:
                pair = (r, wanted[r].index(successor[1]))
        if pair is not None and pair not in taken and leaf.sig is not None and \
                leaf.sig.outputs[index][::2] == successor[0].sig.outputs[successor[1]][::2]:
            taken.add(pair)
        else:
            pair = None
        pairs.append(pair)
    return tuple(pairs) if taken else ()


def single_target(graph) -> tuple[int, ...] | None:
    """The one device set all of ``graph`` runs on (``None``: every device).

    Raises ``NotImplementedError`` for a graph of independent computations on several
    device sets (``execute`` runs those as one program each).
    """
    placements = _placements(graph, Parts(graph))
    if len(placements) > 1:
        raise NotImplementedError(
            "torchspmd.compile: this step computes on several device sets "
            f"({[p[0] for p in placements]}) independently; compile one step per mesh, or "
            "run it without torchspmd.compile")
    return placements[0][0] if placements else None


def note_in_flight(arrays: list) -> None:
    """``arrays`` are the latest outputs on their devices (``wait_device_ops`` waits on them)."""
    if arrays:
        _IN_FLIGHT[frozenset(d.id for d in arrays[0].sharding.device_set)] = arrays


def in_flight_ids() -> set[int]:
    """``id`` of every array the in-flight lists hold (each is one more reference to it)."""
    return {id(a) for arrays in _IN_FLIGHT.values() for a in arrays}


_SINGLE = jax.sharding.SingleDeviceSharding


def _on_devices(array: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    """An output that does not depend on the program's inputs (``x.fill_(v)``) comes back
    on JAX's default device alone; it belongs, replicated, on the program's devices."""
    if len(ids) > 1 and isinstance(array.sharding, jax.sharding.SingleDeviceSharding):
        return transfer.reshard(array, transfer.replicated_on(ids))
    return array


# Per program: the layout (sharding object) of each input array the last time every input
# entered it as it was, and the devices it ran on. A training loop feeds a program the
# outputs of its previous run, whose shardings are the same objects step after step: one
# identity test per input then stands for working out placements and placing each input.
_LAYOUTS: "weakref.WeakKeyDictionary[Program, tuple]" = weakref.WeakKeyDictionary()
# Per program and donated positions: the bytes donated (the graph key fixes the shapes).
_DONATED_BYTES: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()


def _as_last_time(graph, known: tuple) -> list[jax.Array] | None:
    """The graph's input arrays if each has the layout ``known`` recorded for its position
    (then each enters the program as it is, on the same devices), else None."""
    shardings, _, annotations = known
    # Host data is uploaded as it is annotated: only with last time's annotations does
    # it take last time's layouts (else placement must see the annotations themselves,
    # with no leaf uploaded yet).
    for position, (leaf, _) in enumerate(graph.leaves):
        if leaf.host is not None and leaf.sharding is not annotations[position]:
            return None
    inputs = []
    for position, (leaf, index) in enumerate(graph.leaves):
        if leaf.host is not None:
            upload_leaf(leaf)
        array = leaf.arrays[index]
        if array is None or type(array) is FailedValue or array.sharding is not shardings[position]:
            return None  # the usual path raises what it must
        inputs.append(array)
    return inputs


def _note_layouts(program: Program, graph, inputs: list, target) -> None:
    """Remember the inputs' layouts for :func:`_as_last_time` if all entered as they were."""
    for (leaf, index), placed in zip(graph.leaves, inputs):
        if placed is not leaf.arrays[index]:
            _LAYOUTS.pop(program, None)
            return
    _LAYOUTS[program] = ([a.sharding for a in inputs], target,
                         [leaf.sharding for leaf, _ in graph.leaves])


def _donated_bytes(program: Program, inputs: list, donate: tuple[int, ...]) -> int:
    known = _DONATED_BYTES.setdefault(program, {})
    count = known.get(donate)
    if count is None:
        count = known[donate] = sum(inputs[i].nbytes for i in donate)
    return count


def _placed_inputs(graph, target: tuple[int, ...] | None) -> list[jax.Array]:
    """The graph's input arrays, all over the devices ``target`` (all devices if None), in
    id order."""
    ids = target if target is not None else tuple(range(len(devices())))
    for leaf, _ in graph.leaves:
        if leaf.host is not None:
            upload_leaf(leaf)
    return [placement.place(_array(leaf, i), ids) for leaf, i in graph.leaves]


def upload_leaf(leaf: Node, sharding=None) -> None:
    """Send a host leaf to the devices (where the sharding it was marked with places it)."""
    leaf.arrays = [transfer.upload(leaf.host, leaf.sharding or sharding)]
    leaf.host = None


def release_later(spent) -> None:
    """Keep ``spent`` (what a call consumed) until the host next waits for the devices."""
    _SPENT.append(spent)


def release_spent() -> None:
    """Free what runs consumed (see ``_SPENT``). Called before a host read or wait blocks
    (the devices still compute), and before each run's donation analysis, so that what
    it keeps never counts as a holder of a value."""
    if _SPENT:
        _SPENT.clear()


def wait_device_ops() -> None:
    """Block until every computation started so far has finished."""
    release_spent()
    # A donated buffer was consumed by a later program, which is waited on instead.
    jax.block_until_ready([a for arrays in _IN_FLIGHT.values() for a in arrays
                           if not a.is_deleted()])
    _IN_FLIGHT.clear()


def last_program() -> Program | None:
    """The program of the latest execution (``None`` before any)."""
    return _LAST[0] if _LAST else None


def compiled_programs() -> int:
    """How many compiled programs the compile cache holds."""
    return len(_PROGRAMS)
