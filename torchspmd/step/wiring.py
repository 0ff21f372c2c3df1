"""How a captured step's program connects to the step's state, worked out once per plan:
where each value the step hands out comes from, which inputs the program may consume,
and the order in which it returns its outputs.

Example::

    wiring = wire(captured, recyclable)
    wiring.origins[j]     # FromProgram(flat=3, index=0) or FromInput(source=5, index=0)
    wiring.donated        # the sources whose buffers go to the program
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step.capture import Captured
from torchspmd.step.counters import CounterGroup
from torchspmd.step.routes import (ArgSource, ArgTarget, RefilledSource, SlotTarget,
                                   StorageSource, StorageTarget)


@dataclass(frozen=True)
class FromProgram:
    """A value the program computes: its output ``flat`` (in the order the program returns
    them); ``index``, the value's output index in its recorded node."""

    flat: int
    index: int


@dataclass(frozen=True)
class FromInput:
    """An input handed back unchanged: source ``source``; ``index`` as in FromProgram."""

    source: int
    index: int


Origin = Union[FromProgram, FromInput]


@dataclass(frozen=True)
class KeepsStorageValue:
    """The output overwrites a storage the step also reads (source ``source``, donated
    ``donated``-th): when nothing else holds the storage's old value, that value stays and
    takes the call's array (no node made and dropped per state tensor)."""

    source: int
    donated: int


@dataclass(frozen=True)
class KeepsGradient:
    """A new gradient whose slot's old tensor (spare ``spare``, ``recycle.Spares``) only
    its slot holds: that tensor stays in the slot and takes the call's array."""

    spare: int


@dataclass(frozen=True)
class Wiring:
    """The program's side of a plan (see the module docstring)."""

    origins: tuple[Origin, ...]  # per output
    sigs: tuple  # per output, the signature of the node computing it
    donated: tuple[int, ...]  # sources whose buffers the program consumes
    kept: tuple[int, ...]  # the other sources the program reads (not the followers below)
    order: tuple[int, ...]  # the program's outputs (as recorded) in the order it returns them
    spares: tuple[int, ...]  # outputs whose new gradient takes a recycled buffer
    spare_flats: tuple[int, ...]  # their outputs as recorded
    keeps: tuple[KeepsStorageValue | KeepsGradient | None, ...]  # per output
    regrads: tuple  # ``.grad`` slots emptied before the program starts (not recycled)
    # Shared counters (``counters.py``): per group, the leading source and the sources
    # the program reads the leader's array in place of.
    followers: tuple[tuple[int, tuple[int, ...]], ...] = ()


def wire(captured: Captured, shared: tuple[CounterGroup, ...] = ()) -> Wiring:
    """The wiring of ``captured``'s program (see :class:`Wiring`); each ``shared``
    counter group travels as its leader: read once, not donated (every counter tensor
    holds its array), returned once."""
    origins, sigs, count = _origins(captured)
    origins, dropped = _lead(origins, shared)
    # An input handed back unchanged (``old.copy_(w)`` before ``w`` is updated: ``old``
    # takes w's array as it is) stays alive after the call: it is not donated.
    handed_back = {o.source for o in origins if isinstance(o, FromInput)}
    donated = tuple(i for i in _donated(captured) if i not in handed_back
                    and not any(i in group.sources for group in shared))
    spares = _spares(captured, origins)
    spare_flats = tuple(origins[j].flat for j in spares)
    order = _order(captured, origins, donated, spare_flats, count, dropped)
    position = {flat: k for k, flat in enumerate(order)}
    origins = tuple(FromProgram(position[o.flat], o.index) if isinstance(o, FromProgram) else o
                    for o in origins)
    recycled = {captured.outputs[j].target.slot for j in spares}
    regrads = tuple(o.target.slot for o in captured.outputs if _fills_grad(o.target)
                    and o.target.slot not in recycled)
    # A follower counter is not an input at all: the program reads its leader's array
    # (each one passed would cost the call a few microseconds, for nothing).
    not_kept = set(donated) | {i for group in shared for i in group.sources[1:]}
    return Wiring(origins, tuple(sigs), donated,
                  tuple(i for i in range(len(captured.sources)) if i not in not_kept),
                  order, spares, spare_flats, _keeps(captured, origins, donated, spares),
                  regrads, tuple((g.sources[0], g.sources[1:]) for g in shared))


def _lead(origins: list[Origin], shared: tuple[CounterGroup, ...]
          ) -> tuple[list[Origin], set[int]]:
    """``origins`` with every shared counter's new value taken from its group leader's
    program output; and the program outputs no one reads any more."""
    alias = {}
    for group in shared:
        lead = origins[group.outputs[0]]
        for j in group.outputs[1:]:
            alias[origins[j].flat] = lead.flat
    origins = [FromProgram(alias[o.flat], o.index)
               if isinstance(o, FromProgram) and o.flat in alias else o for o in origins]
    return origins, set(alias)


def _origins(captured: Captured) -> tuple[list[Origin], list, int]:
    """Per output: where its value comes from (program outputs numbered as recorded);
    per output, its node's signature; and how many outputs the program has."""
    graph = captured.graph
    flat_index = {}
    for root, outs in zip(graph.roots, graph.wanted):
        for i in outs:
            flat_index[(root, i)] = len(flat_index)
    leaf_index = {leaf: k for k, leaf in enumerate(graph.leaves)}
    # A leaf the step made over an input's data (``copy_`` from an annotated tensor hands
    # over its data as a new plain leaf) is that input.
    by_array = {id(node.arrays[i]): k for k, (node, i) in enumerate(graph.leaves)
                if node.arrays is not None}
    origins: list[Origin] = []
    sigs = []
    for output in captured.outputs:
        node, index = value = output.value
        if value in flat_index:
            origins.append(FromProgram(flat_index[value], index))
        elif value in leaf_index:
            origins.append(FromInput(leaf_index[value], index))
        elif node.arrays is not None and id(node.arrays[index]) in by_array:
            origins.append(FromInput(by_array[id(node.arrays[index])], index))
        else:
            raise NotImplementedError(
                "torchspmd.compile: the step hands out data it did not compute or read "
                "(a tensor made from host data and kept); create it outside the step")
        sigs.append(node.sig)
    return origins, sigs, len(flat_index)


def _written(captured: Captured) -> tuple[set[int], set]:
    """The argument positions and the storages the step overwrites."""
    args = {o.target.position for o in captured.outputs if isinstance(o.target, ArgTarget)}
    storages = {o.target.storage() for o in captured.outputs
                if isinstance(o.target, StorageTarget)}
    return args, storages


def _donated(captured: Captured) -> tuple[int, ...]:
    """Sources the step overwrites: their old buffers can go to the program."""
    args, storages = _written(captured)
    donated = []
    for i, source in enumerate(captured.sources):
        if (isinstance(source, ArgSource) and source.position in args
                or isinstance(source, StorageSource) and source.storage() in storages
                or isinstance(source, RefilledSource)):
            donated.append(i)
    return tuple(donated)


def _fills_grad(target) -> bool:
    """Whether ``target`` puts a new tensor in some tensor's ``.grad``."""
    return isinstance(target, SlotTarget) and target.slot.key == "grad" and not target.slot.item


def _spares(captured: Captured, origins: list[Origin]) -> tuple[int, ...]:
    """The new gradients that take their slot's old buffer (``recycle.py``): computed by
    the program, not read by the step, and in a slot that holds a gradient when the step
    starts (not emptied outside it)."""
    read = {s.output for s in captured.sources if isinstance(s, RefilledSource)}
    return tuple(j for j, (o, origin) in enumerate(zip(captured.outputs, origins))
                 if _fills_grad(o.target) and isinstance(origin, FromProgram)
                 and j not in read and not o.target.was_empty)


def _order(captured: Captured, origins: list[Origin], donated: tuple[int, ...],
           spare_flats: tuple[int, ...], count: int, dropped: set[int]) -> tuple[int, ...]:
    """The program's ``count`` outputs but ``dropped`` in the order it returns them: first
    the new value of each donated input, in the donated inputs' order, then the new
    gradients that take recycled buffers (``spare_flats``); then the rest.

    JAX gives each donated buffer to the first output of its shape and dtype still
    without one. Listed in any other order, a parameter's buffer could go to another
    parameter's new value of the same shape while it is still to be read: XLA then
    copies every such input first (92 copies of parameters and moments in the benchmark's
    step). The lazy path does the same (``program._paired_first``)."""
    writes = {}  # what an output overwrites (an argument position, a storage) -> its flat
    for o, origin in zip(captured.outputs, origins):
        if isinstance(origin, FromProgram):
            if isinstance(o.target, ArgTarget):
                writes.setdefault(("arg", o.target.position), origin.flat)
            elif isinstance(o.target, StorageTarget):
                writes.setdefault(o.target.storage(), origin.flat)
    order: list[int] = []
    for i in donated:
        source = captured.sources[i]
        if isinstance(source, ArgSource):
            flat = writes.get(("arg", source.position))
        elif isinstance(source, StorageSource):
            flat = writes.get(source.storage())
        else:  # a refilled slot: the slot's new tensor
            origin = origins[source.output]
            flat = origin.flat if isinstance(origin, FromProgram) else None
        if flat is not None and flat not in order:
            order.append(flat)
    order += [j for j in spare_flats if j not in order]
    chosen = set(order) | dropped
    return tuple(order + [j for j in range(count) if j not in chosen])


def _keeps(captured: Captured, origins: tuple[Origin, ...], donated: tuple[int, ...],
           spares: tuple[int, ...]) -> tuple:
    """Per output, the old value or tensor that takes its array when nothing else holds
    it (:class:`KeepsStorageValue`, :class:`KeepsGradient`), else None."""
    read = {s.storage(): i for i, s in enumerate(captured.sources)
            if isinstance(s, StorageSource)}
    where = {i: k for k, i in enumerate(donated)}
    spare_of = {j: k for k, j in enumerate(spares)}
    keeps = []
    for j, (o, origin) in enumerate(zip(captured.outputs, origins)):
        i = (read.get(o.target.storage()) if isinstance(o.target, StorageTarget)
             and isinstance(origin, FromProgram) else None)
        if i in where:
            keeps.append(KeepsStorageValue(i, where[i]))
        elif j in spare_of and not o.target.requires_grad and o.target.cls is SpmdTensor:
            keeps.append(KeepsGradient(spare_of[j]))
        else:
            keeps.append(None)
    return tuple(keeps)
