"""A whole plan priced as the one program it becomes: XLA's numbers for its step.

The integer program adds up layers, each priced as its change from replicating that
layer (``measure.py``). That sum is a search heuristic, not a prediction: XLA combines
the gradients' all-reduces of many layers into a few (a replicated 2-layer GPT's step
has 2, the layer sum counts 9), and gathers FSDP weights per use. So a plan's predicted
time and memory come from its whole training step (forward, backward and the
optimizer's update) compiled with its shardings (``whole_step``, nothing runs):

    step_overhead_s + machine.time(flops, bytes accessed, collectives)

Programs are cached by batch layout and specs: pricing the same plan again is free.

Example::

    pricer = Pricer(model, mesh, (x, y), loss_fn, repeated=["blocks"],
                    make_optimizer=torch.optim.AdamW, machine=CPU)
    priced = pricer.price(("data",), specs)       # doctest: +SKIP
    priced.seconds, priced.memory_bytes, priced.collectives
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

from torch import nn

from torchspmd.auto_shard.cost_model import Machine
from torchspmd.auto_shard.whole_step import OptimizerFactory, WholeStep, whole_step
from torchspmd.sharding import Mesh

__all__ = ["Priced", "Pricer", "plan_key", "step_seconds"]

COLLECTIVE_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                    "collective-permute")


def plan_key(batch: tuple[str, ...], specs: dict[str, tuple]) -> tuple:
    """What tells two plans apart: the batch axes and every parameter's spec."""
    return batch, tuple(sorted(specs.items()))


def step_seconds(machine: Machine, whole: WholeStep) -> float:
    """A whole step's predicted seconds on ``machine`` (see the module docstring)."""
    return machine.step_overhead_s + machine.time(whole.flops, whole.bytes_accessed,
                                                  whole.collectives)


@dataclasses.dataclass(frozen=True)
class Priced:
    """One plan's predicted step: seconds, bytes per device, collectives per step by kind,
    and XLA's numbers they came from (``whole``)."""

    seconds: float
    memory_bytes: float
    collectives: dict[str, int]
    whole: WholeStep


class Pricer:
    """Prices plans of one model on one mesh (see the module docstring)."""

    def __init__(self, model: nn.Module, mesh: Mesh, example_inputs: tuple,
                 loss_fn: Callable | None, repeated: list[str],
                 make_optimizer: OptimizerFactory, machine: Machine):
        self.model, self.mesh, self.inputs, self.loss_fn = model, mesh, example_inputs, loss_fn
        self.repeated, self.make_optimizer, self.machine = repeated, make_optimizer, machine
        self._seen: dict[Any, Priced] = {}

    def price(self, batch: tuple[str, ...], specs: dict[str, tuple]) -> Priced:
        """The plan that splits the batch over ``batch`` and lays each parameter out as
        ``specs`` says (a missing name: replicated)."""
        key = plan_key(batch, specs)
        if key not in self._seen:
            self._seen[key] = self._price(batch, specs)
        return self._seen[key]

    def _price(self, batch: tuple[str, ...], specs: dict[str, tuple]) -> Priced:
        whole = whole_step(self.model, self.mesh, self.inputs, self.loss_fn, batch,
                           self.repeated, specs, self.make_optimizer)
        kinds = Counter(c.kind for c in whole.collectives)
        return Priced(step_seconds(self.machine, whole), whole.memory_bytes,
                      {k: kinds.get(k, 0) for k in COLLECTIVE_KINDS}, whole)
