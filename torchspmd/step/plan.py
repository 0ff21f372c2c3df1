"""A captured step as one compiled call: gather the inputs, run, write the outputs back.

The recorded graph is replayed through the lowering table by :class:`Program` (the lazy
path's own replay), wrapped in one ``jax.jit`` whose first argument is donated: the
buffers of state the step reads and overwrites (parameters, optimizer moments). A buffer
is donated only when nothing but its own tensor holds it (no alias from a zero-copy
``copy_``, no pending computation, no tensor kept from an earlier step); otherwise a copy
is donated instead, so no one ever sees "Array has been deleted". The gradients the step
replaces are donated too (``recycle.py``), and what a call consumed is freed at the next
read, while the devices compute (``in_flight.release_later``).

Example::

    plan = Plan(captured)
    launch = plan(arg_tensors)                  # one jitted call, returning at once
    result = plan.write_back(launch)            # the call's arrays into the new values
"""

from __future__ import annotations

import math
import operator
import time
import weakref
from dataclasses import dataclass
from itertools import compress

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.node import Node
from torchspmd.lowering import RANDOM_OPS
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.lowering.linalg import matmul_precision_setting
from torchspmd.runtime import execute, in_flight, ownership, placement, rng, transfer
from torchspmd.runtime.cache import LRU
from torchspmd.runtime.memory import check_fits
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.program import Program, donated_first, unrepresentable_output
from torchspmd.runtime.scalar_inputs import SCALAR_KINDS, vectors_of
from torchspmd.sharding.state import new_leaf
from torchspmd.step import optim
from torchspmd.step.capture import Captured
from torchspmd.step.counters import counter_groups, holding_one_value, still_shared
from torchspmd.step.recycle import Spares
from torchspmd.step.side_effects import same_number
from torchspmd.step.slot_reads import SlotReads
from torchspmd.step.routes import (ArgSource, ConstSource, RefilledSource, SlotTarget,
                                   StorageSource)
from torchspmd.step.wiring import Wiring, wire
from torchspmd.step.write_back import Call, Writes, finish, install, new_state, restore

aten = torch.ops.aten
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


def _array(value: tuple[Node, int]):
    """The array of a graph value, None while it is pending."""
    node, index = value
    return node.arrays[index] if node.arrays is not None else None


def _current(storage, pending: list) -> tuple[Node, int]:
    """``storage``'s value, noted in ``pending`` if it is still to be computed."""
    if storage is None:
        raise StalePlan("a tensor the step reads was dropped")
    if storage.value[0].arrays is None:  # changed outside the step
        _filled_from_host(storage)
        pending.append(storage.value)
    return storage.value


class StalePlan(Exception):
    """A tensor the plan reads is gone (its Python object was dropped): capture again."""


def _hold(checks) -> bool:
    """Whether each ``(slot getter, storage ref)`` slot still holds that storage."""
    for get, ref in checks:
        t = get()
        if not isinstance(t, SpmdTensor) or t.handle.storage is not ref():
            return False
    return True


class Plan:
    """The compiled replay of one :class:`Captured` step."""

    def __init__(self, captured: Captured):
        graph = captured.graph
        self.captured = captured
        self.program = Program(graph)
        self.key = graph.key
        self.ids = execute.single_target(graph) or tuple(range(len(jax.devices())))
        # Optimizer step counters holding one value travel as one (``counters.py``).
        self.shared = holding_one_value(captured, counter_groups(captured))
        self.wiring = wiring = wire(captured, self.shared)
        self._unread = frozenset(i for _, followers in wiring.followers for i in followers)
        self.writes = Writes.of(captured)
        self.reads = Reads.of(captured)
        self.slot_reads = SlotReads.of(captured, self.reads, self.writes)
        # Per refilled source, the storage the next call reads: the new tensor the last
        # call put in its slot. A new tuple after each call that launched.
        self.binding: tuple = tuple(captured.sources[i].first for i in self.reads.refilled)
        self._layouts: list = [None] * len(captured.sources)  # each input's layout, once placed
        self._scalars(graph)
        self.spares = Spares([captured.outputs[j].target.slot for j in wiring.spares],
                             [wiring.sigs[j].outputs[wiring.origins[j].index]
                              for j in wiring.spares])
        self.jitted = _jitted(self.program, wiring, self.spares, len(captured.sources))
        self.compiled = None
        self.memory = None  # XLA's memory analysis of the compiled program

    # --- built once ---------------------------------------------------------------------

    def _scalars(self, graph) -> None:
        """The captured scalar inputs, and where each random op's seed sits."""
        program = self.program
        flat = [s for n in graph.nodes for s in n.scalars]
        self.vectors = dict(zip(SCALAR_KINDS, vectors_of(program, flat)))
        # A random op's seed is its node's last int scalar; seeds never share a position
        # (``graph.repeats``), so each draw lands in its own op only. A call draws them in
        # the order the ops were recorded (``node.seq``; the graph's node order may differ),
        # as the capture and the lazy path drew them.
        slots = []
        position = 0
        for node in graph.nodes:
            position += len(node.scalars)
            if node.sig.op in RANDOM_OPS:
                slots.append((node.seq, program.scalar_index[position - 1]))
        self.seed_slots = [slot for _, slot in sorted(slots)]

    # --- each call ----------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the state is as this plan expects: every slot it fills empty, every
        slot it reads holding the tensor it read (or another whole tensor of its kind,
        which the plan then reads: ``slot_reads.py``), found through the same containers, each
        tensor as trainable as it was, each module in the same mode, each optimizer group
        with the same parameters, each CPU tensor it took data from unchanged, each Python
        number it could read (a module's attribute, a global) the same, and the same
        ``torch.set_float32_matmul_precision`` (else the step must be captured again)."""
        optim.prepare(self.captured.optimizers)  # Adam's float lr lent a device scalar
        if matmul_precision_setting() != self.key[-1]:  # the graph key's last item
            return False  # torch.set_float32_matmul_precision changed since the capture
        reads = self.reads
        for get in reads.empty_getters:
            if get() is not None:
                return False
        captured = self.captured
        for place, container in captured.links:  # e.g. ``opt.load_state_dict``
            if place.get() is not container:
                return False
        for t, requires_grad in captured.grad_modes:  # a parameter frozen or thawed
            if t.requires_grad is not requires_grad:
                return False
        for module, training in captured.modes:  # ``model.eval()``, ``model.train()``
            if module.training is not training:
                return False
        for params, then in captured.group_params:  # a parameter added to a group
            if len(params) != len(then) or not all(map(operator.is_, params, then)):
                return False
        for ref, version in captured.host_reads:  # a CPU tensor the step read, changed
            t = ref()
            if t is not None and t._version != version:
                return False
        for get, value in captured.numbers:  # ``model.temperature = 0.5`` between calls
            now = get()
            if now is not value and not same_number(now, value):
                return False
        if not _hold(reads.held):
            # A slot the step reads holds a new tensor of the same kind (the gradients
            # that the next first micro-batch made after ``zero_grad()``): follow it.
            moved = self.slot_reads.moved(reads)
            if not moved:
                return False
            self.reads, self.writes = self.slot_reads.rebound(reads, self.writes, moved)
            COUNTERS["step_slot_follows"] += 1
        return not self.binding or _hold(zip(reads.refilled_getters, self.binding))

    def inputs(self, args: list[SpmdTensor], first: bool = False) -> list[tuple[Node, int]]:
        """The current value of every source (the captured leaves on the first call)."""
        if first:
            return list(self.captured.graph.leaves)
        reads = self.reads
        values = list(reads.consts)
        pending = []  # changed outside the step (a scheduler's fill_, a manual edit)
        # No (source, storage) pairs: hundreds per call, each a container that counts
        # toward Python's next garbage collection.
        for i, ref in reads.storages:  # the bulk: ``_current`` inline
            storage = ref()
            if storage is None or storage.value[0].arrays is None:
                values[i] = _current(storage, pending)
            else:
                values[i] = storage.value
        for i, position in reads.args:
            values[i] = _current(args[position].handle.storage, pending)
        for i, ref in zip(reads.refilled, self.binding):
            values[i] = _current(ref(), pending)
        if pending:
            execute.materialize(pending)
        for i, ref in reads.aliases:
            alias = ref()
            if alias is not None and _array(alias.value) is not _array(values[i]):
                raise StalePlan("a tensor that shared its data with another when the step "
                                "was captured no longer does")
        return values

    def __call__(self, args: list[SpmdTensor], first: bool = False) -> Launch:
        values = self.inputs(args, first)
        arrays = [v[0].arrays[v[1]] for v in values]
        if not first and not still_shared(self.shared, arrays):
            raise StalePlan("a step counter was set apart from the others")
        # What earlier runs consumed must not count as a holder of any input. This plan's
        # own last call is the exception: it consumed none of the arrays this call
        # donates (those are its outputs), so its leftovers are freed after the launch:
        # ~0.6 ms for 600 arrays, no longer before it, and freed after this call made its
        # new arrays, they keep Python's garbage collector from being due
        # (``in_flight.release_spent``).
        after_launch = in_flight.spent_only_by(self)
        if not after_launch:
            in_flight.release_spent()
        donated_ids = self.wiring.donated
        exclusive = (ownership.exclusive(values, arrays, donated_ids, in_flight.in_flight_ids())
                     if not first else [False] * len(donated_ids))
        placed = self._placed(arrays)
        # A buffer someone else holds is donated as a copy.
        donated = [placed[i] if alone else jnp.copy(placed[i])
                   for i, alone in zip(donated_ids, exclusive)]
        kept = [placed[i] for i in self.wiring.kept]
        if not first:
            for place in self.wiring.regrads:
                place.set(None)
        if self.compiled is None and self.spares.places:
            self.spares.shardings = self.spares.parameter_layouts(self._layout_of(placed))
        spare_arrays, recycled, grads = (self.spares.take(first)
                                         if self.spares.shardings is not None else ([], 0, []))
        call = new_state(self.wiring, self.writes, placed, values, exclusive, grads)
        vectors = self._vectors(first)
        if self.compiled is None:
            self._compile(donated, kept, spare_arrays, vectors)
        outputs = self._launch(call, args, (donated, kept, spare_arrays, *vectors))
        if after_launch:
            in_flight.release_spent()
        for module, training in self.captured.mode_changes:  # ``model.train()`` in the step
            module.training = training
        COUNTERS["donated_bytes"] += recycled + sum(compress(self._donated_bytes, exclusive))
        # Not ``values``: the next call reuses most of them (``KeepsStorageValue``), and a
        # holder here would make it copy its inputs instead of donating them.
        in_flight.release_later((arrays, donated, spare_arrays), by=self)
        return Launch(call, outputs, args)

    def _launch(self, call: Call, args: list[SpmdTensor], inputs: tuple) -> list:
        """Run the program on ``inputs``. State takes its new values before it starts
        (their arrays are filled in when it returns): less host work while it runs."""
        replaced = install(call, self.writes, args)
        start = time.perf_counter()
        try:
            outputs = self.compiled(*inputs)
        except BaseException:
            restore(replaced, self.writes)
            raise
        COUNTERS["step_call_s"] += time.perf_counter() - start
        COUNTERS["executions"] += 1
        if self.reads.refilled:
            self.binding = tuple(weakref.ref(call.tensors[self.captured.sources[i].output]
                                             .handle.storage) for i in self.reads.refilled)
        in_flight.note_in_flight(outputs[:1])
        return outputs

    def _placed(self, arrays: list) -> list:
        """``arrays`` on the program's devices, in id order; an array already laid out as
        this input was last time is taken as it is (placing costs host time per input)."""
        layouts = self._layouts
        unread = self._unread
        placed = []
        for i, a in enumerate(arrays):
            if i in unread:  # a follower counter: the program reads its leader
                placed.append(a)
                continue
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
        reads = self.reads
        where = {ref(): i for i, ref in (*reads.storages, *zip(reads.refilled, self.binding))}

        def layout_of(t: SpmdTensor):
            i = where.get(t.handle.storage)
            return placed[i].sharding if i is not None else None

        return layout_of

    def _vectors(self, first: bool) -> list:
        """The scalar inputs of this call, with fresh seeds (the first call's are those the
        capture drew as it recorded, as the lazy path uses them: a seed set before a call
        gives the same draws whether that call captures or replays); kept on the devices
        between calls while their values repeat (``Program.placed_vectors``)."""
        ints = self.vectors[int]
        if self.seed_slots and not first:
            ints = ints.copy()
            for slot in self.seed_slots:
                ints[slot] = rng.next_seed()
        return self.program.placed_vectors([self.vectors[float], ints, self.vectors[bool]],
                                           self.ids)

    def _compile(self, donated, kept, spare_arrays, vectors) -> None:
        layout = tuple((a.shape, a.dtype, a.sharding) for a in (*donated, *kept, *spare_arrays))
        key = (self.key, self.wiring.donated, self.wiring.followers, layout)
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

    def write_back(self, launch: Launch):
        """Finish the step from what ``__call__`` returned: the call's arrays into the new
        values; the step's result."""
        return finish(launch.call, launch.outputs, self.writes, self.captured, launch.args)


@dataclass(frozen=True)
class Launch:
    """A launched call: its new state, the program's (still computing) outputs, and the
    call's tensor arguments (a result may be one of them, or a view of one)."""

    call: Call
    outputs: list
    args: list


def _jitted(program: Program, wiring: Wiring, spares: Spares, inputs: int):
    """The program as one ``jax.jit`` that consumes the donated inputs and the spare
    gradient buffers, and returns its outputs in ``wiring.order``."""

    def replay(leaves, spare_arrays, floats, ints, bools):
        for lead, followers in wiring.followers:  # shared counters: one value
            for i in followers:
                leaves[i] = leaves[lead]
        flat = [a for group in program.replay(leaves, floats, ints, bools) for a in group]
        if spare_arrays:  # each new gradient in the layout its spare buffer has
            for j, sharding in zip(wiring.spare_flats, spares.shardings):
                flat[j] = jax.lax.with_sharding_constraint(flat[j], sharding)
        return [flat[j] for j in wiring.order]

    # keep_unused: the spare buffers are read by no op, only written into.
    return jax.jit(donated_first(replay, inputs, wiring.donated, wiring.kept),
                   donate_argnums=(0, 2), keep_unused=True)


@dataclass(frozen=True)
class Reads:
    """Where a plan reads its sources on each call, grouped by kind (source index first
    in each pair), and the slots it checks before a replay."""

    consts: tuple  # per source, the constant's value, None for the others
    args: tuple  # (source, argument position)
    storages: tuple  # (source, weakref to the storage)
    refilled: tuple  # sources read from a slot the step refills (``Plan.binding``)
    refilled_getters: tuple  # their slots' ``Place.getter()``
    held: tuple  # (slot getter, storage ref): the slot must still hold that storage
    empty_getters: tuple  # slots that must be empty (the step fills them)
    held_sources: tuple  # the source of each ``held`` entry, in its order
    aliases: tuple  # (source, storage ref): must still hold the source's array

    @staticmethod
    def of(captured: Captured) -> "Reads":
        sources = list(enumerate(captured.sources))
        refilled = tuple(i for i, s in sources if isinstance(s, RefilledSource))
        held = tuple(i for i, s in sources if isinstance(s, StorageSource) and s.slot is not None)
        return Reads(
            tuple(s.value if isinstance(s, ConstSource) else None for _, s in sources),
            tuple((i, s.position) for i, s in sources if isinstance(s, ArgSource)),
            tuple((i, s.storage) for i, s in sources if isinstance(s, StorageSource)),
            refilled, tuple(captured.sources[i].slot.getter() for i in refilled),
            tuple((captured.sources[i].slot.getter(), captured.sources[i].storage) for i in held),
            tuple(o.target.slot.getter() for o in captured.outputs
                  if isinstance(o.target, SlotTarget) and o.target.was_empty),
            held, tuple(captured.aliases))
