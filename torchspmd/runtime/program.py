"""A compiled graph: the nodes replayed through the lowering table inside ``jax.jit``.

A :class:`Program` is built from a graph's signatures and wiring only (never from the
nodes themselves), so it serves every later graph with the same key.
"""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torchspmd.lazy.node import TENSOR, ScalarSlot, TensorMeta
from torchspmd.lowering import LOWERINGS, RANDOM_OPS
from torchspmd.lowering.annotation_ops import SHARD_TO_FULL, SHARDING_CONSTRAINT
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.lowering import jax_private
from torchspmd.runtime import transfer
from torchspmd.runtime.donation import NOT_USABLE, output_avals
from torchspmd.runtime.graph import OUTPUTS, Graph
from torchspmd.runtime.manual_regions import check_region, exit_region, manual_steps, run_region
from torchspmd.runtime.memory import check_fits
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.run_state import RunState
from torchspmd.runtime.scalar_inputs import (SCALAR_KINDS, scalar_kinds, unstack, vector_layout,
                                             vectors_of)


class Program:
    """The jitted replay of one graph shape; call :meth:`run` with a graph of that key."""

    def __init__(self, graph: Graph):
        position = {n: i for i, n in enumerate(graph.nodes)}
        self.steps = [(n.sig, codes) for n, codes in zip(graph.nodes, graph.operands)]
        self.roots = [(position[r], list(outs)) for r, outs in zip(graph.roots, graph.wanted)]
        # Each step's scalar inputs: which vector (float, int or bool) each comes from.
        self.step_kinds = [scalar_kinds(sig) for sig, _ in self.steps]
        self.scalar_kinds = [kind for kinds in self.step_kinds for kind in kinds]
        # Per vector (float, int, bool): the positions in the graph's flat list of scalars
        # of the values it holds, worked out once rather than filtered on every run; and
        # per scalar, its index in its vector (equal scalars, ``graph.repeats``, share one).
        self.vector_positions, self.scalar_index = vector_layout(self.scalar_kinds,
                                                                  graph.repeats)
        self.output_avals = output_avals(graph)  # what donated buffers may become
        self.manual = manual_steps(self.steps)
        check_region(self.steps, self.manual, self.roots)
        self.barriers = resharded_inputs(self.steps)
        # A graph that reads no data and names no sharding (factory ops only) would run
        # on JAX's default device alone; unsharded data lives replicated on every device.
        placed = bool(graph.leaves) or any(sig.op is SHARDING_CONSTRAINT for sig, _ in self.steps)
        # keep_unused: JAX drops inputs a program does not read, and a program left with
        # none runs on its default device alone (`x.zero_()` read by itself would land on
        # device 0, and mixing it with anything else later raise MeshMismatchError).
        self.jitted = (jax.jit(self.replay, keep_unused=True) if placed else
                       jax.jit(self.replay, out_shardings=transfer.replicated()))
        self.compiled_once = False
        # Set when JAX could not express an output layout XLA chose: outputs are then
        # replicated over the program's devices (``run``).
        self._out_sharding = None
        # One process: its vectors may live on the devices (in several, each call sends
        # its own host copy, as jit does with numpy arguments).
        self._keeps_vectors = jax.process_count() == 1
        # Per set of donated leaf positions and their paired outputs: the jit that donates
        # them and the outputs it lists first, and whether it has been compiled (a training
        # step donates the same leaves every time).
        self._donating: dict[tuple, object] = {}
        self._compiled_donations: set[tuple] = set()
        self._last_args = None  # the latest run's argument layouts, for optimized_hlo()
        # Per scalar vector: (host value, its device copy, device ids) of the latest run.
        self._vector_copies: list = [None] * len(SCALAR_KINDS)
        self.state = RunState()  # what ``execute`` learns running it (``run_state``)

    def run(self, graph: Graph, leaf_arrays: list, donate: tuple[int, ...] = (),
            ids: tuple[int, ...] | None = None, pairs: tuple = ()) -> list[list]:
        """See :meth:`_run`. If JAX cannot express an output layout XLA chose (see
        :func:`unrepresentable_output`), the program is compiled again with replicated
        outputs, and stays so."""
        try:
            return self._run(graph, leaf_arrays, donate, ids, pairs)
        except Exception as error:  # noqa: BLE001  (only the one JAX error is retried)
            if self._out_sharding is not None or not unrepresentable_output(error):
                raise
        self._replicate_outputs(ids)
        return self._run(graph, leaf_arrays, donate, ids, pairs)

    def _replicate_outputs(self, ids: tuple[int, ...] | None) -> None:
        """From now on every output of this program is replicated over its devices."""
        self._out_sharding = (transfer.replicated_on(ids) if ids is not None
                              else transfer.replicated())
        self.jitted = jax.jit(self.replay, keep_unused=True, out_shardings=self._out_sharding)
        self.compiled_once = False
        self._donating.clear()
        self._compiled_donations.clear()

    def _run(self, graph: Graph, leaf_arrays: list, donate: tuple[int, ...] = (),
             ids: tuple[int, ...] | None = None, pairs: tuple = ()) -> list[list]:
        """Execute on ``graph``'s scalars and ``leaf_arrays``; the roots' output arrays.

        The leaves at positions ``donate`` give their buffers to the program (see
        ``donation.lazy_donations``): those arrays are deleted by the call; ``pairs``
        names, per donated leaf, the output (root position, position in its group) that
        should take its buffer, or None (see ``execute._paired_outputs``). ``ids``: the
        devices the program runs on, where its scalar vectors are kept between runs
        (``None``: they travel from the host on every call).
        """
        vectors = vectors_of(self, [s for n in graph.nodes for s in n.scalars])
        vectors = self.placed_vectors(vectors, ids)
        # Layouts only: holding the arrays would keep last step's buffers alive.
        self._last_args = ([(a.aval, a.sharding) for a in leaf_arrays], vectors, donate, pairs)
        jitted, args, hoisted = self._call(leaf_arrays, donate, pairs)
        del leaf_arrays
        start = time.perf_counter()
        key = (donate, pairs)
        first = (key not in self._compiled_donations) if donate else not self.compiled_once
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NOT_USABLE)
            if first:  # compiled here and reused by the call below
                cpu = time.process_time()
                compiled = jitted.lower(*args, *vectors).compile()
                COUNTERS["compile_cpu_s"] += time.process_time() - cpu
                check_fits(compiled, graph)
            marked = _count_run(graph)
            try:
                outputs = jitted(*args, *vectors)
            except BaseException:  # it did not run: the counts are as before
                _uncount_run(graph, marked)
                raise
        if hoisted:  # the outputs listed first go back to their groups
            first_outputs, outputs = outputs
            for (r, k), array in zip(hoisted, first_outputs):
                outputs[r][k] = array
        if first:
            if donate:
                self._compiled_donations.add(key)
            else:
                self.compiled_once = True
            COUNTERS["compile_time_s"] += time.perf_counter() - start
        return outputs

    def placed_vectors(self, vectors: list[np.ndarray], ids: tuple[int, ...] | None) -> list:
        """The scalar vectors as arrays replicated on devices ``ids``, the latest run's
        copy reused when its values are the same: a numpy argument is sent to every
        device by each call, which costs host time (~0.5 ms a call on 8 CPU devices).
        With ``ids`` None, or several processes, they stay numpy (each call sends them)."""
        if ids is None or not self._keeps_vectors:
            return vectors
        placed = []
        for k, vector in enumerate(vectors):
            known = self._vector_copies[k]
            # The very array of last time (a compiled step's, when it draws no seeds):
            # callers never change a vector they passed.
            if known is not None and known[2] == ids and (
                    known[0] is vector or (known[0].shape == vector.shape
                                           and np.array_equal(known[0], vector))):
                placed.append(known[1])
                continue
            copy = _replicated_copy(vector, transfer.replicated_on(ids))
            self._vector_copies[k] = (vector, copy, ids)
            placed.append(copy)
        return placed

    def _call(self, leaf_arrays: list, donate: tuple[int, ...], pairs: tuple = ()):
        """The jit to call, its leaf arguments (``[leaves]``, or ``[donated], [kept]``), and
        the outputs it lists first (``pairs`` without the Nones, see ``_paired_first``)."""
        if not donate:
            return self.jitted, [leaf_arrays], []
        known = self._donating.get((donate, pairs))
        if known is None:
            hoisted = [p for p in pairs if p is not None]
            replay = donated_first(self.replay, len(leaf_arrays), donate)
            if hoisted:
                replay = _paired_first(replay, hoisted)
            extra = {} if self._out_sharding is None else {"out_shardings": self._out_sharding}
            known = self._donating[(donate, pairs)] = (
                jax.jit(replay, donate_argnums=(0,), keep_unused=True, **extra), hoisted)
        chosen = set(donate)
        return known[0], [[leaf_arrays[i] for i in donate],
                          [a for i, a in enumerate(leaf_arrays) if i not in chosen]], known[1]

    def optimized_hlo(self) -> str:
        """XLA's optimized, partitioned HLO of the latest run (collectives are visible here)."""
        return self._compiled().as_text()

    def memory_analysis(self):
        """XLA's memory analysis of the latest run's program, per device: bytes of its
        arguments, outputs and temporaries (``.temp_size_in_bytes``)."""
        return self._compiled().memory_analysis()

    def _compiled(self):
        leaves, vectors, donate, pairs = self._last_args
        abstract = [jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding)
                    for aval, sharding in leaves]
        jitted, args, _ = self._call(abstract, donate, pairs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NOT_USABLE)
            return jitted.lower(*args, *vectors).compile()

    def replay(self, leaves, floats, ints, bools) -> list:
        """The graph's values from its leaves and scalar vectors, as JAX functions.

        Traced by ``jax.jit`` (``self.jitted``); a compiled step (``step/plan.py``) also
        calls it inside its own traced function. Returns one list of arrays per root.
        Example: ``program.replay(leaf_arrays, floats, ints, bools)``.
        """
        COUNTERS["graphs_compiled"] += 1  # runs only while JAX traces, i.e. compiles
        vectors = {float: unstack(floats), int: unstack(ints), bool: unstack(bools)}
        index = iter(self.scalar_index)
        step_scalars = [[vectors[k][next(index)] for k in kinds] for kinds in self.step_kinds]
        values: list = [None] * len(self.steps)

        def operand(code):
            return leaves[~code] if code < 0 else values[code // OUTPUTS][code % OUTPUTS]

        for i, (sig, operands) in enumerate(self.steps):
            if i in self.manual:
                continue  # computed by the region's shard_map, at its first exit
            if sig.op is SHARD_TO_FULL:
                if values[i] is None:
                    run_region(self.steps, self.manual, values, operand, lower_node,
                               step_scalars, exit_region(self.steps, self.manual, i))
                continue
            values[i] = lower_node(sig, [operand(c) for c in operands], step_scalars[i])
            if i in self.barriers:
                values[i] = [jax.lax.optimization_barrier(v) for v in values[i]]
        return [[values[p][i] for i in outs] for p, outs in self.roots]


# Ops that only lay an input out otherwise (what XLA may fold into the input itself).
_LAYOUT_ONLY = {torch.ops.aten.clone.default, torch.ops.aten._unsafe_view.default}


def resharded_inputs(steps: list) -> frozenset[int]:
    """The sharding constraints that lay out a program input (a leaf, or views of one).

    XLA miscompiles a scatter of one index (``x.at[0].set(v)``, ``index_fill_``) into
    such a constraint's result when the input is replicated: the partitioned update
    falls back to the wrong row of the whole input on the devices that do not own the
    index (``tests/lowering/test_xla_scatter_into_resharded_input.py`` keeps the
    plain-JAX repro; JAX 0.10.2, both partitioners). An optimization barrier after the
    constraint keeps XLA from folding the reshard into the scatter (an FSDP-style weight
    all-gathered by such a constraint kept the same collectives and fusions with it)."""
    from_input: set[int] = set()  # steps whose value is an input's, laid out otherwise
    found = set()
    for i, (sig, operands) in enumerate(steps):
        if not operands or not (operands[0] < 0 or operands[0] // OUTPUTS in from_input):
            continue
        if sig.op is SHARDING_CONSTRAINT:
            found.add(i)
            from_input.add(i)
        elif getattr(sig.op, "is_view", False) or sig.op in _LAYOUT_ONLY:
            from_input.add(i)
    return frozenset(found)


def unrepresentable_output(error: BaseException) -> bool:
    """Whether ``error`` is JAX failing to express an output sharding XLA chose over the
    mesh of an input: after compiling, JAX re-expresses each output's layout over the
    first ``NamedSharding`` input's mesh, ignoring its ``_logical_device_ids``, and
    re-raises ``IndivisibleError`` when the tiles do not fit that mesh (a permuted mesh,
    ``tests/sharding/test_permuted_meshes.py`` keeps a plain-JAX repro). Matched by name:
    the class is private to JAX."""
    return any(t.__name__ == "IndivisibleError" for t in type(error).__mro__)


def _count_run(graph: Graph) -> list:
    """Count a run of ``graph`` before it is launched: once it runs, the program takes the
    host's cores, and whatever the host still does until ``sync()`` returns waits for one
    (on CPU devices; a launch then costs the host a scheduler time slice, ~4 ms). Returns
    the nodes it marked as run for the first time (for :func:`_uncount_run`)."""
    COUNTERS["executions"] += 1
    COUNTERS["ops_executed"] += len(graph.nodes)
    marked = [node for node in graph.nodes if not node.ran]
    for node in marked:
        node.ran = True
    # Intermediates not kept are computed again if read later.
    COUNTERS["ops_rerun"] += len(graph.nodes) - len(marked)
    return marked


def _uncount_run(graph: Graph, marked: list) -> None:
    """Undo :func:`_count_run` for a launch that failed."""
    COUNTERS["executions"] -= 1
    COUNTERS["ops_executed"] -= len(graph.nodes)
    COUNTERS["ops_rerun"] -= len(graph.nodes) - len(marked)
    for node in marked:
        node.ran = False


def _replicated_copy(vector: np.ndarray, sharding) -> jax.Array:
    """``jax.device_put(vector, sharding)`` for a sharding that replicates it on this
    process's devices, through the batched put ``device_put`` ends in: ``device_put``'s
    own Python costs ~50 us a call (more with cold caches), paid every step by the
    scalar vector a learning-rate schedule changes. Falls back to ``device_put`` where
    this JAX lays its internals out differently."""
    devices = jax_private.addressable_devices(sharding)
    return jax_private.put_shards(vector.shape, vector.dtype, sharding,
                                  [vector] * len(devices), devices)


def donated_first(replay, count: int, donate: tuple[int, ...],
                  kept: tuple[int, ...] | None = None):
    """``replay(leaves, *rest)`` taking ``(donated_leaves, kept_leaves, *rest)`` instead.

    ``jax.jit`` donates whole arguments, so the leaves at positions ``donate`` (of
    ``count``) travel as one list, argument 0, and the others (or only those at
    positions ``kept``; the rest reach ``replay`` as None) as argument 1.
    """
    if kept is None:
        chosen = set(donate)
        kept = [i for i in range(count) if i not in chosen]

    def call(donated_arrays, kept_arrays, *rest):
        leaves = [None] * count
        for i, a in zip(donate, donated_arrays):
            leaves[i] = a
        for i, a in zip(kept, kept_arrays):
            leaves[i] = a
        return replay(leaves, *rest)

    return call


def _paired_first(replay, pairs: list[tuple[int, int]]):
    """``replay`` returning ``(first, groups)``: the outputs at ``pairs`` (root position,
    position in its group) listed first, in that order, and left out of ``groups``."""

    def call(*args):
        groups = replay(*args)
        first = [groups[r][k] for r, k in pairs]
        for r, k in pairs:
            groups[r][k] = None
        return first, groups

    return call


def lower_node(sig, inputs: list, scalars: list) -> list:
    """One node through its lowering: the call rebuilt from its template, outputs checked.

    ``inputs`` are the JAX values of the node's tensor operands and ``scalars`` its graph
    scalars, in template order. Example: ``lower_node(node.sig, [x], [])``.
    """
    inputs, scalars = iter(inputs), iter(scalars)
    args = [_fill(a, inputs, scalars) for a in sig.template]
    kwargs = {k: _fill(v, inputs, scalars) for k, v in sig.kw_template}
    if sig.op in RANDOM_OPS:
        kwargs["key"] = jax.random.key(next(scalars))
    return _check(sig, LOWERINGS[sig.op](_jax_meta(sig), *args, **kwargs))


def _fill(item, inputs, scalars):
    if item is TENSOR:
        return next(inputs)
    if isinstance(item, ScalarSlot):
        return next(scalars)
    if isinstance(item, tuple):
        return [_fill(i, inputs, scalars) for i in item]
    return item


def _jax_meta(sig):
    metas = tuple(_struct(m) for m in sig.outputs)
    return metas if _returns_sequence(sig.op, len(metas)) else metas[0]


def _returns_sequence(op, count: int) -> bool:
    """Whether ``op`` returns a tuple or list (``split`` may return a list of one)."""
    schema = getattr(op, "_schema", None)
    if schema is None:  # annotation pseudo-ops
        return count != 1
    returns = schema.returns
    return len(returns) != 1 or str(returns[0].type).startswith("List")


def _struct(meta):
    if isinstance(meta, TensorMeta):
        return jax.ShapeDtypeStruct(meta.shape, to_jax_dtype(meta.dtype))
    return None


def _check(sig, result) -> list:
    """The lowering's outputs as a list, in the inferred dtypes; shape mismatches are bugs."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(sig.outputs):
        raise AssertionError(f"torchspmd: lowering of {sig.op} returned {len(results)} outputs, "
                             f"expected {len(sig.outputs)}")
    checked = []
    for value, meta in zip(results, sig.outputs):
        if meta is None or value is None:
            checked.append(None)
            continue
        value = jnp.asarray(value)
        if tuple(value.shape) != meta.shape:
            raise AssertionError(f"torchspmd: lowering of {sig.op} gave shape {value.shape}, "
                                 f"PyTorch infers {meta.shape}")
        dtype = to_jax_dtype(meta.dtype)
        checked.append(value if value.dtype == dtype else value.astype(dtype))
    return checked
