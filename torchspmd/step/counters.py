"""Optimizer step counters that hold one value travel through a compiled step as one.

PyTorch's Adam and AdamW (with ``capturable=True``, which ``optim.py`` sets) keep a
``step`` tensor per parameter and advance them together with one
``torch._foreach_add_(steps, 1)``. Unless someone edits one, they hold the same number,
yet the program would carry N counter inputs, N increments, N bias corrections (a few
scalar kernels each) and N outputs for that one value: extra kernels XLA starts before
anything else, on the calling thread, when all inputs are ready.

When a step's counters hold equal values at capture, the plan passes the first
counter's array in place of every counter of the group (XLA then merges the N identical
increments and bias corrections into one), returns one new counter, and hands that one
array to every counter tensor. ``optimizer.state_dict()`` still shows a ``step`` tensor
per parameter, each with the right value. Each later call checks, by identity, that the
counters still share one array; a counter edited by hand (or loaded from another
checkpoint) breaks that, and the step is captured again, with the counters apart.

Example::

    groups = counter_groups(captured)    # one CounterGroup per foreach increment
    shared = holding_one_value(captured, groups)
    still_shared(shared, arrays)         # per call: False -> capture again
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from torchspmd.step.capture import Captured
from torchspmd.step.routes import StorageSource, StorageTarget

aten = torch.ops.aten


@dataclass(frozen=True)
class CounterGroup:
    """Scalar counters advanced by one foreach increment: per counter, its source (where
    the step reads it) and its output (the new value, written back into the same
    storage), in the increment's order. The first counter leads."""

    sources: tuple[int, ...]
    outputs: tuple[int, ...]


def counter_groups(captured: Captured) -> tuple[CounterGroup, ...]:
    """The step's counter groups: each ``_foreach_add.Scalar`` node whose inputs are two or
    more distinct 0-d leaves, each read from a storage its output is written back into."""
    graph = captured.graph
    if graph is None:
        return ()
    source_of = {leaf: i for i, leaf in enumerate(graph.leaves)}
    written = {}  # graph value -> the output writing it into a storage
    for j, output in enumerate(captured.outputs):
        if isinstance(output.target, StorageTarget):
            written.setdefault(output.value, j)
    groups = []
    for node in graph.nodes:
        if node.sig.op is not aten._foreach_add.Scalar or len(node.inputs) < 2:
            continue
        metas = node.sig.outputs
        if any(m is None or tuple(m.shape) != () or m.dtype != metas[0].dtype for m in metas):
            continue
        sources = tuple(source_of.get(value) for value in node.inputs)
        outputs = tuple(written.get((node, k)) for k in range(len(node.inputs)))
        if None in sources or None in outputs or len(set(sources)) != len(sources):
            continue
        if all(_same_storage(captured, i, j) for i, j in zip(sources, outputs)):
            groups.append(CounterGroup(sources, outputs))
    return tuple(groups)


def _same_storage(captured: Captured, source: int, output: int) -> bool:
    """Whether ``output`` writes back into the storage ``source`` reads."""
    read = captured.sources[source]
    if not isinstance(read, StorageSource):
        return False
    storage = read.storage()
    return storage is not None and captured.outputs[output].target.storage() is storage


def holding_one_value(captured: Captured, groups: tuple[CounterGroup, ...]
                      ) -> tuple[CounterGroup, ...]:
    """The groups whose counters hold equal values in the captured call (read from the
    devices once per capture; a replicated scalar's local copy is its value)."""
    leaves = captured.graph.leaves
    shared = []
    for group in groups:
        values = []
        for i in group.sources:
            node, index = leaves[i]
            array = node.arrays[index] if node.arrays is not None else None
            if array is None:
                break
            values.append(np.asarray(array.addressable_data(0)))
        else:
            if all(np.array_equal(v, values[0]) for v in values[1:]):
                shared.append(group)
    return tuple(shared)


def still_shared(shared: tuple[CounterGroup, ...], arrays: list) -> bool:
    """Whether each shared group's counters still hold one array (as a replay leaves
    them); a counter set by other code holds another."""
    for group in shared:
        lead = arrays[group.sources[0]]
        for i in group.sources[1:]:
            if arrays[i] is not lead:
                return False
    return True
