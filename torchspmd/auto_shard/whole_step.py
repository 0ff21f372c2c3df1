"""XLA's numbers for the model's whole forward and backward under one batch layout.

The layer programs (``measure``) price what a candidate changes; the work between the
layers (attention, norms, the loss) and the memory of the activations they keep depend
on the batch layout, not on the candidates. So for each batch layout the planner records
the model's forward and backward once on the spmd device (parameters replicated, inputs
split on the batch dim, each repeated layer's output kept on that split, as
``AutoShardPlan.apply`` does), compiles that pending graph (nothing runs) and reads its
cost and memory analysis and collectives.

Example::

    measured = whole_step(model, mesh, (x, y), loss_fn, ("data",), ["blocks"])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable

import torch
from torch import nn

from torchspmd.auto_shard.candidates import axes_entry
from torchspmd.auto_shard.collectives import Collective, read_compiled
from torchspmd.debug import pending_program
from torchspmd.sharding import Mesh, mark_sharding

__all__ = ["WholeStep", "whole_step"]


@dataclasses.dataclass(frozen=True)
class WholeStep:
    """Per-device numbers of the compiled forward + backward (no optimizer)."""

    flops: float
    bytes_accessed: float
    collectives: tuple[Collective, ...]
    memory_bytes: int  # arguments + outputs - aliased + temporaries
    # The compiled program itself (a ``jax.stages.Compiled``), for ``trials`` to run.
    program: Any = dataclasses.field(default=None, compare=False, repr=False)


def _split(mesh: Mesh, batch: tuple[str, ...], t: torch.Tensor) -> None:
    shards = math.prod(mesh.shape()[a] for a in batch)
    if t.dim() > 0 and t.shape[0] % shards == 0:
        mark_sharding(t, mesh, (axes_entry(batch),) + (None,) * (t.dim() - 1))


def whole_step(model: nn.Module, mesh: Mesh, example_inputs: tuple,
               loss_fn: Callable | None, batch: tuple[str, ...],
               repeated: list[str], specs: dict[str, tuple] | None = None) -> WholeStep:
    """Compile the forward and backward of a copy of ``model`` (see module), its
    parameters replicated or, with ``specs``, marked with them."""
    spmd = copy.deepcopy(model).to("spmd")
    if hasattr(spmd, "tie_weights"):
        spmd.tie_weights()  # Module.to gives each use of a shared weight its own copy
    for name, p in spmd.named_parameters():
        if specs is not None and name in specs:
            mark_sharding(p, mesh, specs[name])
    inputs = []
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            t = t.to("spmd")
            _split(mesh, batch, t)
        inputs.append(t)

    def keep_split(module, args, output) -> None:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor):
            _split(mesh, batch, first)

    for container in repeated:
        for layer in spmd.get_submodule(container):
            layer.register_forward_hook(keep_split)
    loss: Any = loss_fn(spmd, *inputs) if loss_fn is not None else spmd(*inputs)
    if not isinstance(loss, torch.Tensor):
        loss = loss[0] if isinstance(loss, (tuple, list)) else loss.logits
    loss = loss.float().sum()
    params = [p for p in spmd.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    compiled = pending_program([loss, *(g for g in grads if g is not None)]).compile()
    costs = read_compiled(compiled, mesh.size())
    memory = costs.memory
    used = (memory.argument_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    return WholeStep(costs.flops, costs.bytes_accessed, costs.collectives, int(used), compiled)
