"""A whole plan priced as the one program it becomes: XLA's numbers for its step.

The integer program adds up layers, each priced as its change from replicating that
layer (``measure.py``). That sum is a search heuristic, not a prediction: XLA combines
the gradients' all-reduces of many layers into a few (a replicated 2-layer GPT's step
has 2, the layer sum counts 9), and gathers FSDP weights per use. So a plan's predicted
time and memory come from its whole forward and backward compiled with its shardings
(``whole_step``, nothing runs), plus the optimizer's elementwise update of its state
(read the parameter, gradient and moments, write the parameter and moments):

    step_overhead_s + machine.time(flops, bytes accessed + update bytes, collectives)

Programs are cached by batch layout and specs: pricing the same plan again is free.

Example::

    pricer = Pricer(model, mesh, (x, y), loss_fn, repeated=["blocks"], slots=2, machine=CPU)
    priced = pricer.price(("data",), specs)       # doctest: +SKIP
    priced.seconds, priced.memory_bytes, priced.collectives
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Any, Callable

from torch import nn

from torchspmd.auto_shard.cost_model import Machine
from torchspmd.auto_shard.whole_step import WholeStep, whole_step
from torchspmd.sharding import Mesh

__all__ = ["Priced", "Pricer", "plan_key", "shard_bytes", "step_seconds"]

COLLECTIVE_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                    "collective-permute")


def shard_bytes(shape, spec, itemsize: int, mesh: Mesh) -> float:
    """Bytes of one device's shard of an array of ``shape`` laid out by ``spec``.

    Example::

        >>> import numpy as np, torchspmd as xs
        >>> shard_bytes((8, 4), ("data", None), 4, xs.Mesh(np.arange(8), (4, 2), ("data", "model")))
        32.0
    """
    sizes = mesh.shape()
    shards = 1
    for entry in spec:
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            shards *= sizes[axis] if axis is not None else 1
    return math.prod(shape) * itemsize / shards


def plan_key(batch: tuple[str, ...], specs: dict[str, tuple]) -> tuple:
    """What tells two plans apart: the batch axes and every parameter's spec."""
    return batch, tuple(sorted(specs.items()))


def step_seconds(machine: Machine, whole: WholeStep, update_bytes: float) -> float:
    """A whole step's predicted seconds on ``machine`` (see the module docstring)."""
    return machine.step_overhead_s + machine.time(
        whole.flops, whole.bytes_accessed + update_bytes, whole.collectives)


@dataclasses.dataclass(frozen=True)
class Priced:
    """One plan's predicted step: seconds, bytes per device, collectives per step by kind,
    and the numbers they came from (``whole``: XLA's; ``update_bytes``: the optimizer's)."""

    seconds: float
    memory_bytes: float
    collectives: dict[str, int]
    whole: WholeStep
    update_bytes: float


class Pricer:
    """Prices plans of one model on one mesh (see the module docstring)."""

    def __init__(self, model: nn.Module, mesh: Mesh, example_inputs: tuple,
                 loss_fn: Callable | None, repeated: list[str], slots: int, machine: Machine):
        self.model, self.mesh, self.inputs, self.loss_fn = model, mesh, example_inputs, loss_fn
        self.repeated, self.slots, self.machine = repeated, slots, machine
        self._params = {n: (tuple(p.shape), p.element_size())
                        for n, p in model.named_parameters()}
        self._seen: dict[Any, Priced] = {}
        self.seconds = 0.0  # spent recording and compiling whole steps

    @property
    def programs(self) -> int:
        """How many whole steps were compiled (one per distinct plan)."""
        return len(self._seen)

    def price(self, batch: tuple[str, ...], specs: dict[str, tuple]) -> Priced:
        """The plan that splits the batch over ``batch`` and lays each parameter out as
        ``specs`` says (a missing name: replicated)."""
        key = plan_key(batch, specs)
        if key not in self._seen:
            start = time.perf_counter()
            self._seen[key] = self._price(batch, specs)
            self.seconds += time.perf_counter() - start
        return self._seen[key]

    def _price(self, batch: tuple[str, ...], specs: dict[str, tuple]) -> Priced:
        whole = whole_step(self.model, self.mesh, self.inputs, self.loss_fn, batch,
                           self.repeated, specs)
        state = sum(shard_bytes(shape, specs.get(name, ()), item, self.mesh)
                    for name, (shape, item) in self._params.items())
        update = state * (3 + 2 * self.slots)
        seconds = step_seconds(self.machine, whole, update)
        kinds = Counter(c.kind for c in whole.collectives)
        return Priced(seconds, whole.memory_bytes + self.slots * state,
                      {k: kinds.get(k, 0) for k in COLLECTIVE_KINDS}, whole, update)
