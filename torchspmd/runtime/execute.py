"""sync: compile (or find in the cache) and run the pending graph; results become data."""

from __future__ import annotations

import jax

from torchspmd.lazy.handle import PENDING, PENDING_VIEWS
from torchspmd.lazy.node import Node
from torchspmd.lowering.annotations import SHARDING_CONSTRAINT
from torchspmd.runtime import placement, transfer
from torchspmd.runtime.graph import collect
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.program import Program

# The compile cache (a registry the design names): graph key -> Program.
_PROGRAMS: dict[tuple, Program] = {}
# The latest program run, for debug.last_hlo() / debug.collectives().
_LAST: list[Program] = []
# The latest run's outputs per device set: a device runs programs in order, so waiting
# for these waits for everything before them (and holds no older step's buffers).
_IN_FLIGHT: dict[frozenset, list] = {}


def sync(wait: bool = False) -> None:
    """Compile and run every live tensor's pending graph.

    Example::

        loss = model(x).sum(); loss.backward(); opt.step()
        torchspmd.sync()   # one compiled program for the whole step
    """
    values = [s.value for s in list(PENDING)] + [h.pending_view_value() for h in list(PENDING_VIEWS)]
    wanted: dict[Node, set[int]] = {}
    for value in values:
        if value is not None and not value[0].is_leaf:
            wanted.setdefault(value[0], set()).add(value[1])
    PENDING.clear()
    PENDING_VIEWS.clear()
    roots = sorted(wanted, key=lambda n: n.seq)
    try:
        execute(roots, wanted)
    except placement.MeshMismatchError:
        # Independent work on two sub-meshes (two models side by side): one graph each.
        groups = _by_device_set(roots)  # raises again if one computation mixes meshes
        if len(groups) == 1:
            raise
        for group in groups:
            execute(group, wanted)
    if wait:
        wait_device_ops()


def _by_device_set(roots: list[Node]) -> list[list[Node]]:
    """``roots`` grouped by the device set their computations run on.

    Roots joined by a pending node are one computation and stay in one group, so a
    computation that really mixes two meshes raises ``MeshMismatchError``.
    """
    graph = collect(roots)
    parent = {n: n for n in graph.nodes}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in graph.nodes:
        for n, _ in node.inputs:
            if not n.is_leaf:
                parent[find(n)] = find(node)
    components: dict[Node, list[Node]] = {}
    for root in roots:
        components.setdefault(find(root), []).append(root)
    groups: dict = {}
    for members in components.values():
        target = _target(collect(members))
        groups.setdefault(None if target is None else frozenset(target), []).extend(members)
    return [sorted(g, key=lambda n: n.seq) for g in groups.values()]


def _target(graph) -> tuple[int, ...] | None:
    """The sub-mesh ``graph`` runs on (``None``: where its inputs are); raises on a mix."""
    on_device = [_array(leaf, i) for leaf, i in graph.leaves if leaf.host is None]
    constraints = [n.sig.template[1] for n in graph.nodes if n.sig.op is SHARDING_CONSTRAINT]
    constraints += [leaf.sharding for leaf, _ in graph.leaves if leaf.host is not None and leaf.sharding]
    return placement.target_devices(on_device, constraints)


def materialize(values: list[tuple[Node, int]]) -> list[jax.Array]:
    """The arrays of ``values``, running just the graph they need."""
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
    return array


def execute(roots: list[Node], wanted: dict | None = None) -> None:
    """Run the graph of ``roots``; afterwards each root is a leaf holding its arrays."""
    if not roots:
        return
    graph = collect(roots, wanted)
    inputs = _placed_inputs(graph)
    program = _PROGRAMS.get(graph.key)
    if program is None:
        program = _PROGRAMS[graph.key] = Program(graph)
    else:
        COUNTERS["cache_hits"] += 1
    outputs = program.run(graph, inputs)
    _LAST[:] = [program]
    for root, indices, arrays in zip(graph.roots, graph.wanted, outputs):
        full = [None] * len(root.sig.outputs)
        for i, a in zip(indices, arrays):
            full[i] = a
        root.materialized(full)
    produced = [a for arrays in outputs for a in arrays]
    if produced:
        _IN_FLIGHT[frozenset(d.id for d in produced[0].sharding.device_set)] = produced


def _placed_inputs(graph) -> list[jax.Array]:
    """The graph's input arrays, all on the device set the graph runs on."""
    target = _target(graph)
    for leaf, _ in graph.leaves:
        if leaf.host is not None:
            upload_leaf(leaf)
    arrays = [_array(leaf, i) for leaf, i in graph.leaves]
    if target is None:
        return arrays
    return [placement.restrict(a, target) if frozenset(placement.device_ids(a.sharding))
            != frozenset(target) else a for a in arrays]


def upload_leaf(leaf: Node, sharding=None) -> None:
    """Send a host leaf to the devices (with the sharding it was marked with, if any)."""
    leaf.arrays = [transfer.upload(leaf.host, leaf.sharding or sharding)]
    leaf.host = None


def wait_device_ops() -> None:
    """Block until every computation started so far has finished."""
    jax.block_until_ready([a for arrays in _IN_FLIGHT.values() for a in arrays])
    _IN_FLIGHT.clear()


def last_program() -> Program | None:
    """The program of the latest execution (``None`` before any)."""
    return _LAST[0] if _LAST else None


def compiled_programs() -> int:
    """How many distinct graphs are in the compile cache."""
    return len(_PROGRAMS)
