"""A call's new state: the values and tensors a replay hands out, made before its program
starts, put into the step's storages and slots, and filled with the program's arrays
when it returns.

Example::

    call = new_state(plan.wiring, plan.writes, placed, values, exclusive, grads)
    replaced = install(call, plan.writes, args)                 # state takes the new values
    result = finish(call, outputs, plan.writes, plan.captured)  # the call's arrays in them
"""

from __future__ import annotations

from dataclasses import dataclass


from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import Node
from torchspmd.step.arguments import unflatten
from torchspmd.step.capture import Captured
from torchspmd.step.routes import AliasReturn, ArgTarget, ReturnTarget, SlotTarget, StorageTarget
from torchspmd.step.wiring import FromInput, KeepsStorageValue, Wiring


@dataclass(frozen=True)
class Writes:
    """Where a plan's outputs go, grouped by kind (output index first in each pair)."""

    storages: tuple  # (output, StorageTarget) and (output, ArgTarget): written in place
    slots: tuple  # (output, SlotTarget): a new tensor in a slot
    returns: tuple  # (output, position in the flattened result)
    tensors: tuple  # per output, its target if it gets a new tensor (slot, result), else None
    slot_getters: tuple  # per slot, ``Place.getter()`` (a loop over many slots per call)
    emptied: tuple = ()  # slots the step empties (``Captured.emptied``)

    @staticmethod
    def of(captured: Captured) -> "Writes":
        targets = tuple(o.target for o in captured.outputs)
        outputs = list(enumerate(targets))
        slots = tuple((j, t) for j, t in outputs if isinstance(t, SlotTarget))
        return Writes(
            tuple((j, t) for j, t in outputs if isinstance(t, (StorageTarget, ArgTarget))),
            slots, tuple((j, t.position) for j, t in outputs if isinstance(t, ReturnTarget)),
            tuple(t if isinstance(t, (SlotTarget, ReturnTarget)) else None for t in targets),
            tuple(t.slot.getter() for _, t in slots), tuple(captured.emptied))


@dataclass
class Call:
    """One call's new state, per output: its graph value (the array comes when the
    program returns, unless it is an input handed back) and, for a slot or a result, its
    new tensor; and where the program's arrays go: ``node arrays, index, output`` in a
    row for each (flat, not a tuple each: hundreds per call, and every container made
    counts toward Python's next garbage collection)."""

    values: list
    tensors: list
    fills: list


@dataclass(frozen=True)
class Replaced:
    """What :func:`install` replaced, for :func:`restore`."""

    storages: list
    held: list  # each storage's value before
    slots: list  # each slot's tensor before
    emptied: list  # each emptied slot's tensor before


def new_state(wiring: Wiring, writes: Writes, placed: list, values: list, exclusive: list,
              grads: list) -> Call:
    """The new values and tensors of a call (see :class:`Call`). Built before the program
    starts: host work done while it runs competes with it for the host's cores. A storage
    whose old value only it holds keeps that value, and a gradient only its slot holds
    stays, with the new array (``wiring.keeps``)."""
    call = Call([], [], [])
    for target, origin, sig, keeps in zip(writes.tensors, wiring.origins, wiring.sigs,
                                          wiring.keeps):
        if keeps is not None:
            if isinstance(keeps, KeepsStorageValue):
                kept = (values[keeps.source], None) if exclusive[keeps.donated] else None
            else:
                grad = grads[keeps.spare] if grads else None
                kept = (grad.handle.storage.value, grad) if grad is not None else None
            if kept is not None:
                value, tensor = kept
                call.fills += (value[0].arrays, value[1], origin.flat)
                call.values.append(value)
                call.tensors.append(tensor)
                continue
        node = Node(sig)
        arrays = node.arrays = [None] * len(sig.outputs)
        index = origin.index
        if isinstance(origin, FromInput):
            arrays[index] = placed[origin.source]
        else:
            call.fills += (arrays, index, origin.flat)
        value = (node, index)
        call.values.append(value)
        call.tensors.append(None if target is None else _tensor(target, value, sig.outputs[index]))
    return call


def _tensor(target: SlotTarget | ReturnTarget, value, meta) -> SpmdTensor:
    """The new tensor of a slot or result output."""
    if isinstance(target, SlotTarget):
        tensor = SpmdTensor(Handle.new(value, meta), requires_grad=target.requires_grad)
        if target.cls is not SpmdTensor:  # nn.Parameter
            tensor = target.cls(tensor, requires_grad=target.requires_grad)
        return tensor
    return SpmdTensor(Handle.new(value, meta))


def install(call: Call, writes: Writes, args: list[SpmdTensor]) -> Replaced:
    """Put each new value in the storage the step wrote and each new tensor in its slot
    (their arrays come when the program returns); returns what they held."""
    storages = [args[t.position].handle.storage if isinstance(t, ArgTarget) else t.storage()
                for _, t in writes.storages]
    held = [storage.value for storage in storages]
    for storage, (j, _), value in zip(storages, writes.storages, held):
        new = call.values[j]
        if new is value:  # kept (``KeepsStorageValue``): views of it must re-derive
            storage.version += 1
        else:
            storage.set(new)
    slots = [get() for get in writes.slot_getters]
    for (j, t), tensor in zip(writes.slots, slots):
        if call.tensors[j] is not tensor:
            t.slot.set(call.tensors[j])
    emptied = [place.get() for place in writes.emptied]
    for place in writes.emptied:
        place.set(None)
    return Replaced(storages, held, slots, emptied)


def restore(replaced: Replaced, writes: Writes) -> None:
    """Undo :func:`install` (the program did not start)."""
    for storage, value in zip(replaced.storages, replaced.held):
        storage.set(value)
    for (_, t), tensor in zip(writes.slots, replaced.slots):
        t.slot.set(tensor)
    for place, tensor in zip(writes.emptied, replaced.emptied):
        place.set(tensor)


def finish(call: Call, outputs: list, writes: Writes, captured: Captured, args: list):
    """The program's arrays into the call's new values; the step's result."""
    fills = iter(call.fills)
    for arrays, index, k in zip(fills, fills, fills):
        arrays[index] = outputs[k]
    results = list(captured.result_leaves)
    for j, position in writes.returns:
        results[position] = call.tensors[j]
    for alias in captured.alias_returns:
        results[alias.position] = _aliased(alias, args)
    return unflatten(results, captured.result_spec)


def _aliased(alias: AliasReturn, args: list) -> SpmdTensor:
    """The returned tensor of ``alias`` for this call: the holding tensor itself, or the
    same view of its current data (``AliasReturn``)."""
    holder = alias.holder
    if isinstance(holder, ArgTarget):
        if alias.itself:
            return args[holder.position]
        storage = args[holder.position].handle.storage
    elif isinstance(holder, StorageTarget):
        same = alias.tensor() if alias.itself else None
        if same is not None and same.handle.storage is holder.storage():
            return same  # the parameter (or moment, or gradient) itself
        storage = holder.storage()
    else:
        tensor = holder.get()
        if alias.itself:
            return tensor
        storage = tensor.handle.storage
    return SpmdTensor(Handle(storage, alias.meta, alias.view, identity=alias.identity))
