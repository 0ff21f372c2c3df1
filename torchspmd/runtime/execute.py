"""sync: compile (or find in the cache) and run the pending graph; results become data.

Independent computations of one graph run where their own inputs and annotations place
them (``placement``), as one program per device set. A program that cannot fit in device
memory is refused before it runs (``memory``). A program that fails to compile or run
fails alone: its independent computations are retried one by one, and the values of each
that fails again raise its error when read (``failure``); everything else stays usable.
"""

from __future__ import annotations

import gc

import jax
import torch

from torchspmd.jax_setup import devices
from torchspmd.lazy.handle import PENDING, PENDING_VIEWS
from torchspmd.lazy.node import Node
from torchspmd.lazy.provenance import is_recording, refuse_host_read
from torchspmd.runtime import hooks, manual_regions, memory, placement, shape_changes, transfer
from torchspmd.runtime.donation import lazy_donations
from torchspmd.runtime.failure import FailedValue, is_failed, mark_failed
from torchspmd.runtime.cache import LRU, programs_capacity_from_env
from torchspmd.runtime.graph import collect
from torchspmd.runtime.in_flight import (in_flight_ids, note_in_flight, release_later,
                                         release_spent, wait_device_ops)
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.parts import Parts
from torchspmd.runtime.program import Program
from torchspmd.runtime.run_state import InputLayouts
from torchspmd.runtime.transfer import upload_leaf

__all__ = ["sync", "take_pending", "successors", "wanted_outputs", "set_compile_cache_size",
           "materialize", "execute", "single_target", "last_program", "compiled_programs"]

# The compile cache (a registry the design names): graph key -> Program, bounded (LRU).
_PROGRAMS = LRU(programs_capacity_from_env(), evictions="programs_evicted")
# The latest program run, for debug.last_hlo() / debug.collectives().
_LAST: list[Program] = []


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
    known = program.state.input_layouts if program is not None else None
    inputs = known.inputs(graph) if known is not None else None
    if inputs is not None:
        target = known.target
    else:
        parts = program.state.parts if program is not None else None
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
            shape_changes.note_compile(graph)
            program = _PROGRAMS[graph.key] = Program(graph)
            program.state.parts = parts
        program.state.input_layouts = InputLayouts.of(graph, inputs, target)
    # Leaves only this run reads (state it overwrites) give their buffers to it.
    donate = lazy_donations(graph, inputs, in_flight_ids(), program.output_avals)
    if donate:
        COUNTERS["donated_bytes"] += program.state.bytes_donated(inputs, donate)
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
    # the program for the host's cores (see ``in_flight``).
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


_SINGLE = jax.sharding.SingleDeviceSharding


def _on_devices(array: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    """An output that does not depend on the program's inputs (``x.fill_(v)``) comes back
    on JAX's default device alone; it belongs, replicated, on the program's devices."""
    if len(ids) > 1 and isinstance(array.sharding, jax.sharding.SingleDeviceSharding):
        return transfer.reshard(array, transfer.replicated_on(ids))
    return array


def _placed_inputs(graph, target: tuple[int, ...] | None) -> list[jax.Array]:
    """The graph's input arrays, all over the devices ``target`` (all devices if None), in
    id order."""
    ids = target if target is not None else tuple(range(len(devices())))
    for leaf, _ in graph.leaves:
        if leaf.host is not None:
            upload_leaf(leaf)
    return [placement.place(_array(leaf, i), ids) for leaf, i in graph.leaves]


def last_program() -> Program | None:
    """The program of the latest execution (``None`` before any)."""
    return _LAST[0] if _LAST else None


def compiled_programs() -> int:
    """How many compiled programs the compile cache holds."""
    return len(_PROGRAMS)
