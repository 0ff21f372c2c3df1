"""A captured step as one compiled call: gather the inputs, run, write the outputs back.

The recorded graph is replayed through the lowering table by :class:`Program` (the lazy
path's own replay), wrapped in one ``jax.jit`` whose first argument is donated: the
buffers of state the step reads and overwrites (parameters, optimizer moments). A buffer
is donated only when nothing but its own tensor holds it (no alias from a zero-copy
``copy_``, no pending computation, no tensor kept from an earlier step); otherwise a copy
is donated instead, so no one ever sees "Array has been deleted". The gradients the step
replaces are donated too (``recycle.py``), and what a call consumed is freed at the next
read, while the devices compute (``execute.release_later``).

Example::

    plan = Plan(captured)
    run = plan(arg_tensors)                    # one jitted call, returning at once
    result = plan.write_back(run)               # the call's arrays into the new values
"""

from __future__ import annotations

import math
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._pytree import tree_unflatten

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import Node
from torchspmd.lowering import RANDOM_OPS
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.runtime import donation, execute, placement, rng, transfer
from torchspmd.runtime.cache import LRU
from torchspmd.runtime.memory import check_fits
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.program import Program, donated_first, unrepresentable_output
from torchspmd.sharding.state import new_leaf
from torchspmd.step import optim, wiring
from torchspmd.step.capture import Captured
from torchspmd.step.recycle import Spares

aten = torch.ops.aten
_VECTOR_DTYPES = {float: np.float64, int: np.int64, bool: np.bool_}
# Compiled steps by graph key, donated inputs and input layouts: a step captured again
# (a hyperparameter changed, state moved) reuses its executable.
_EXECUTABLES = LRU(64)


def _filled_from_host(storage) -> None:
    """A pending ``fill_`` of a one-element tensor with a Python number (a scheduler's new
    learning rate) as host data: the step uploads the number instead of running a
    program of its own for the fill."""
    node, _ = storage.value
    meta = storage.meta
    if (node.host is None and node.sig.op is aten.fill.Scalar and len(node.scalars) == 1
            and math.prod(meta.shape) == 1):
        host = np.full(meta.shape, node.scalars[0], dtype=to_jax_dtype(meta.dtype))
        storage.set(new_leaf(meta, host=host))


class StalePlan(Exception):
    """A tensor the plan reads is gone (its Python object was dropped): capture again."""


class Plan:
    """The compiled replay of one :class:`Captured` step."""

    def __init__(self, captured: Captured):
        graph = captured.graph
        self.captured = captured
        self.program = Program(graph)
        self.key = graph.key
        self.ids = execute.single_target(graph)
        if self.ids is None:
            self.ids = tuple(range(len(jax.devices())))
        self.sources = list(captured.sources)
        self._layouts: list = [None] * len(self.sources)  # each input's layout, once placed
        self._scalars(graph)
        self.refs, self.sigs, self.flat_outputs = wiring.output_refs(captured)
        self.donated = wiring.donated_sources(captured, self.sources)
        donated = set(self.donated)
        self.kept = [i for i in range(len(self.sources)) if i not in donated]
        # ``.grad`` slots the step fills with new tensors (after ``zero_grad()``): their old
        # gradients are dropped before the program starts, because freeing device buffers
        # while a program runs costs several times more host time.
        self.regrads = [t[1] for t in captured.targets
                        if t[0] == "place" and t[1].key == "grad" and not t[1].item]
        # Those the step computes and does not read, and that hold a gradient when it
        # starts (not emptied outside the step): their old buffers are recycled.
        spare = [j for j, (t, ref) in enumerate(zip(captured.targets, self.refs))
                 if t[0] == "place" and t[1] in self.regrads and ref[0] == "out"
                 and j not in captured.substitutions and t[1] not in captured.empty_places]
        self.spares = Spares([captured.targets[j][1] for j in spare],
                             [self.sigs[j].outputs[self.refs[j][2]] for j in spare])
        self.regrads = [p for p in self.regrads if p not in self.spares.places]
        spare_flats = [self.refs[j][1] for j in spare]
        program, spares = self.program, self.spares
        order, self.refs = wiring.output_order(captured, self.sources, self.refs, self.donated,
                                               spare_flats, self.flat_outputs)

        def replay(leaves, spare_arrays, floats, ints, bools):
            flat = [a for group in program._replay(leaves, floats, ints, bools) for a in group]
            if spare_arrays:  # each new gradient in the layout its spare buffer has
                for j, sharding in zip(spare_flats, spares.shardings):
                    flat[j] = jax.lax.with_sharding_constraint(flat[j], sharding)
            return [flat[j] for j in order]

        # keep_unused: the spare buffers are read by no op, only written into.
        self.jitted = jax.jit(donated_first(replay, len(self.sources), tuple(self.donated)),
                              donate_argnums=(0, 2), keep_unused=True)
        # (output, position in the results) of each tensor the step returns; (output,
        # kind, storage ref or argument) of each storage it writes; (output, slot) of
        # each slot it fills.
        targets = captured.targets
        self.returns = [(k, t[1]) for k, t in enumerate(targets) if t[0] == "return"]
        self._written = [(k, t[0], t[1]) for k, t in enumerate(targets)
                         if t[0] in ("storage", "arg")]
        self._slots = [(k, t[1]) for k, t in enumerate(targets) if t[0] == "place"]
        # Per output: (source, position in ``donated``) of the storage it overwrites when
        # the step reads that storage too, else None. When the storage's old value is
        # held by nothing else (the buffer goes to the program), the call's output goes
        # into that same value, and no graph node is made and dropped per state tensor.
        read = {id(ref()): i for i, (kind, ref) in enumerate(self.sources) if kind == "storage"}
        where = {i: k for k, i in enumerate(self.donated)}
        # A ``.grad`` slot whose old gradient only it holds keeps that tensor the same
        # way (``Spares.take``). Per output: ("storage", source, position), ("grad",
        # spare) or None.
        spare_of = {j: k for k, j in enumerate(spare)}
        self._reuse = []
        for j, (t, ref) in enumerate(zip(targets, self.refs)):
            i = read.get(id(t[1]())) if t[0] == "storage" and ref[0] == "out" else None
            self._reuse.append(("storage", i, where[i]) if i in where else
                               ("grad", spare_of[j]) if j in spare_of and t[2] == (False, SpmdTensor)
                               else None)
        self.compiled = None
        self.memory = None  # XLA's memory analysis of the compiled program
        self._empty_getters = [place.getter() for place in captured.empty_places]
        self._slot_getters = [place.getter() for _, place in self._slots]
        self._source_getters = [(i, place.getter()) for i, place in
                                captured.source_places.items()]

    # --- built once ---------------------------------------------------------------------

    def _scalars(self, graph) -> None:
        """The captured scalar inputs, and where each random op's seed sits."""
        kinds = self.program.scalar_kinds
        flat = [s for n in graph.nodes for s in n.scalars]
        self.vectors = {k: np.array([s for s, kk in zip(flat, kinds) if kk is k],
                                    dtype=_VECTOR_DTYPES[k]) for k in (float, int, bool)}
        self.seed_slots = []
        position = 0
        ints_before = 0
        for node in graph.nodes:
            node_kinds = kinds[position:position + len(node.scalars)]
            if node.sig.op in RANDOM_OPS:  # the seed is the node's last int scalar
                self.seed_slots.append(ints_before + node_kinds.count(int) - 1)
            ints_before += node_kinds.count(int)
            position += len(node.scalars)

    # --- each call ----------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the state is as this plan expects: every slot it fills empty, every
        slot it reads holding the tensor it read (else the step must be captured again)."""
        optim.prepare(self.captured.optimizers)  # a float lr set by hand -> device scalar
        for get in self._empty_getters:
            if get() is not None:
                return False
        sources = self.sources
        for index, get in self._source_getters:
            t = get()
            if not isinstance(t, SpmdTensor) or t._h.storage is not sources[index][1]():
                return False
        return True

    def inputs(self, args: list[SpmdTensor], first: bool = False) -> list[tuple[Node, int]]:
        """The current value of every source (the captured leaves on the first call)."""
        if first:
            return list(self.captured.graph.leaves)
        values = []
        pending = []  # changed outside the step (a scheduler's fill_, a manual edit)
        for kind, ref in self.sources:
            if kind == "const":
                values.append(ref)
                continue
            storage = args[ref]._h.storage if kind == "arg" else ref()
            if storage is None:
                raise StalePlan("a tensor the step reads was dropped")
            if storage.value[0].arrays is None:
                _filled_from_host(storage)
                pending.append(storage.value)
            values.append(storage.value)
        if pending:
            execute.materialize(pending)
        return values

    def __call__(self, args: list[SpmdTensor], first: bool = False):
        values = self.inputs(args, first)
        arrays = [v[0].arrays[v[1]] for v in values]
        # What earlier runs consumed (this plan's last call, a program ``inputs`` ran), if
        # no read has freed it yet: it must not count as a holder of any input.
        execute.release_spent()
        flying = execute.in_flight_ids()
        exclusive = (donation.exclusive(values, arrays, self.donated, flying) if not first
                     else [False] * len(self.donated))
        placed = self._placed(arrays)
        donated = []
        for i, alone in zip(self.donated, exclusive):
            if alone:
                donated.append(placed[i])
            else:  # someone else holds this buffer: donate a copy
                donated.append(jnp.copy(placed[i]))
        kept = [placed[i] for i in self.kept]
        if not first:
            for place in self.regrads:
                place.set(None)
        if self.compiled is None and self.spares.places:
            self.spares.shardings = self.spares.parameter_layouts(self._layout_of(placed))
        spare_arrays, recycled, grads = (self.spares.take(first)
                                         if self.spares.shardings is not None else ([], 0, []))
        fresh, fills = self._fresh(placed, values, exclusive, grads)
        vectors = self._vectors()
        if self.compiled is None:
            self._compile(donated, kept, spare_arrays, vectors)
        # State takes its new values before the program starts (their arrays are filled
        # in when it returns): less host work while it runs.
        replaced = self._install(fresh, args)
        try:
            outputs = self.compiled(donated, kept, spare_arrays, *vectors)
        except BaseException:
            self._restore(replaced)
            raise
        COUNTERS["executions"] += 1
        COUNTERS["donated_bytes"] += recycled + sum(
            n for n, alone in zip(self._donated_bytes, exclusive) if alone)
        execute.note_in_flight(outputs[:1])
        execute.release_later((values, arrays, donated, spare_arrays))
        return outputs, fills, fresh

    def _placed(self, arrays: list) -> list:
        """``arrays`` on the program's devices, in id order; an array already laid out as
        this input was last time is taken as it is (placing costs host time per input)."""
        layouts = self._layouts
        placed = []
        for i, a in enumerate(arrays):
            sharding = a.sharding
            if sharding is not layouts[i]:
                # Kept as the new object when equal: an output's layout object is the
                # same on every call, so the next call compares identities only.
                if layouts[i] is None or sharding != layouts[i]:
                    a = placement.place(a, self.ids)
                    if self.compiled is not None and not a.sharding.is_equivalent_to(
                            layouts[i], a.ndim):
                        # The program was compiled for another layout of this input (the
                        # state came back from a call laid out otherwise): capture again.
                        raise StalePlan("an input's layout changed")
                layouts[i] = a.sharding
            placed.append(a)
        return placed

    def _layout_of(self, placed: list):
        """``tensor -> its layout as this call reads it`` (None if the step does not)."""
        where = {ref(): i for i, (kind, ref) in enumerate(self.sources) if kind == "storage"}

        def layout_of(t: SpmdTensor):
            i = where.get(t._h.storage)
            return placed[i].sharding if i is not None else None

        return layout_of

    def _vectors(self) -> list:
        """The scalar inputs of this call, with fresh seeds; kept on the devices between
        calls while their values repeat (``Program.placed_vectors``)."""
        ints = self.vectors[int]
        if self.seed_slots:
            ints = ints.copy()
            for slot in self.seed_slots:
                ints[slot] = rng.next_seed()
        return self.program.placed_vectors([self.vectors[float], ints, self.vectors[bool]],
                                           self.ids)

    def _compile(self, donated, kept, spare_arrays, vectors) -> None:
        layout = tuple((a.shape, a.dtype, a.sharding) for a in (*donated, *kept, *spare_arrays))
        key = (self.key, tuple(self.donated), layout)
        cached = _EXECUTABLES.get(key)
        self._donated_bytes = [a.nbytes for a in donated]
        if cached is not None:  # the same graph captured again (hyperparameters changed)
            self.compiled, self.memory = cached
            return
        start, cpu = time.perf_counter(), time.process_time()
        # Compiled ahead of time for its memory analysis, then called directly: jit's own
        # cache would not know of this compile and would compile the program again.
        try:
            self.compiled = self.jitted.lower(donated, kept, spare_arrays, *vectors).compile()
        except Exception as error:  # noqa: BLE001  (only the one JAX error is retried)
            if not unrepresentable_output(error):
                raise
            # An output layout JAX cannot express over a permuted mesh: replicate outputs.
            self.jitted = jax.jit(self.jitted.__wrapped__, donate_argnums=(0, 2),
                                  keep_unused=True,
                                  out_shardings=transfer.replicated_on(self.ids))
            self.compiled = self.jitted.lower(donated, kept, spare_arrays, *vectors).compile()
        COUNTERS["compile_cpu_s"] += time.process_time() - cpu
        check_fits(self.compiled, self.captured.graph)
        self.memory = self.compiled.memory_analysis()
        _EXECUTABLES[key] = (self.compiled, self.memory)
        COUNTERS["compile_time_s"] += time.perf_counter() - start

    def _fresh(self, placed: list, values: list, exclusive: list,
               grads: list) -> tuple[list, list]:
        """For each output: its new value (the array filled in after the call, unless it is
        an input handed back unchanged) and, for a filled slot or a result, its new
        tensor; and where the call's outputs go (``(node.arrays, index, output)``). Built
        before the program starts: host work done while it runs competes with it for the
        host's cores. A storage whose old value only it holds keeps that value, and a
        gradient only its slot holds stays, with the new array (see ``_reuse``)."""
        fresh, fills = [], []
        for target, ref, sig, reuse in zip(self.captured.targets, self.refs, self.sigs,
                                           self._reuse):
            held = None  # (value, tensor) kept, with the output going into the value
            if reuse is not None:
                if reuse[0] == "storage":
                    if exclusive[reuse[2]]:
                        held = (values[reuse[1]], None)
                elif grads and grads[reuse[1]] is not None:
                    held = (grads[reuse[1]]._h.storage.value, grads[reuse[1]])
            if held is not None:
                value = held[0]
                fills.append((value[0].arrays, value[1], ref[1]))
                fresh.append(held)
                continue
            node = Node(sig)
            arrays = node.arrays = [None] * len(sig.outputs)
            index = ref[2]
            if ref[0] == "in":
                arrays[index] = placed[ref[1]]
            else:
                fills.append((arrays, index, ref[1]))
            value = (node, index)
            kind = target[0]
            if kind == "storage" or kind == "arg":
                fresh.append((value, None))
                continue
            if kind == "place":
                requires_grad, cls = target[2]
                tensor = SpmdTensor(Handle.new(value, sig.outputs[index]),
                                    requires_grad=requires_grad)
                if cls is not SpmdTensor:  # nn.Parameter
                    tensor = cls(tensor, requires_grad=requires_grad)
            else:  # a result
                tensor = SpmdTensor(Handle.new(value, sig.outputs[index]))
            fresh.append((value, tensor))
        return fresh, fills

    def _install(self, fresh: list, args: list[SpmdTensor]) -> tuple:
        """Put each new value in the storage the step wrote and each new tensor in its
        slot (their arrays come when the call returns); returns what they held."""
        storages = [ref() if kind == "storage" else args[ref]._h.storage
                    for _, kind, ref in self._written]
        held = [storage.value for storage in storages]
        for storage, (i, _, _), value in zip(storages, self._written, held):
            new = fresh[i][0]
            if new is value:  # kept (``_reuse``): views derived from it must re-derive
                storage.version += 1
            else:
                storage.set(new)
        slots = [get() for get in self._slot_getters]
        for (i, place), tensor in zip(self._slots, slots):
            if fresh[i][1] is not tensor:
                place.set(fresh[i][1])
        sources = None
        if self.captured.substitutions:  # later calls read the slots' new tensors
            sources = list(self.sources)
            for i, source in self.captured.substitutions.items():
                self.sources[source] = ("storage", weakref.ref(fresh[i][1]._h.storage))
        return storages, held, slots, sources

    def _restore(self, replaced: tuple) -> None:
        """Undo :meth:`_install` (the program did not start)."""
        storages, held, slots, sources = replaced
        for storage, value in zip(storages, held):
            storage.set(value)
        for (_, place), tensor in zip(self._slots, slots):
            place.set(tensor)
        if sources is not None:
            self.sources[:] = sources

    def write_back(self, run: tuple):
        """Finish the step from ``run`` (what ``__call__`` returned): the call's arrays
        into the new values; the call's result."""
        outputs, fills, fresh = run
        for arrays, index, k in fills:
            arrays[index] = outputs[k]
        results = list(self.captured.result_leaves)
        for k, position in self.returns:
            results[position] = fresh[k][1]
        return tree_unflatten(results, self.captured.result_spec)
