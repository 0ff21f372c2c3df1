"""XLA's numbers for the model's whole training step under one plan: forward, backward
and the optimizer's update, compiled as one program (nothing runs).

The layer programs (``measure``) price what a candidate changes; a plan's prediction,
and the program the planner times (``trials``), is the whole step. It is recorded on the
spmd device as a user's step would be: a copy of the model with the plan's specs marked
(parameters replicated where it has none), inputs split on the batch dim, each repeated
layer's output kept on that split (as ``AutoShardPlan.apply`` does), the gradients set
and the user's kind of optimizer stepped. The optimizer state goes in as the program's
inputs, laid out like its parameter, as it does in a compiled step after the first: the
optimizer is stepped once on CPU with zero gradients to create it, then loaded onto the
copy. The pending graph of the loss, the new parameters and state and the gradients
(``p.grad`` outlives a step) is compiled with the state's buffers donated to their new
values (a compiled step updates them in place), never run.

Example::

    measured = whole_step(model, mesh, (x, y), loss_fn, ("data",), ["blocks"],
                          make_optimizer=torch.optim.AdamW)           # doctest: +SKIP
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

__all__ = ["WholeStep", "whole_step", "OptimizerFactory"]

# Makes the user's kind of optimizer for a list of parameters (``torch.optim.AdamW``).
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclasses.dataclass(frozen=True)
class WholeStep:
    """Per-device numbers of the compiled training step."""

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


def _state_on_device(model: nn.Module, spmd: nn.Module,
                     make_optimizer: OptimizerFactory) -> torch.optim.Optimizer:
    """The optimizer of ``spmd`` with state (created on CPU from zero gradients; ``spmd``
    is ``model`` moved to the spmd device, parameters in the same order)."""
    cpu = [p for p in model.parameters() if p.requires_grad]
    for p in cpu:
        p.grad = torch.zeros_like(p)
    primed = make_optimizer(cpu)
    primed.step()
    optimizer = make_optimizer([p for p in spmd.parameters() if p.requires_grad])
    optimizer.load_state_dict(primed.state_dict())
    return optimizer


def whole_step(model: nn.Module, mesh: Mesh, example_inputs: tuple,
               loss_fn: Callable | None, batch: tuple[str, ...],
               repeated: list[str], specs: dict[str, tuple] | None = None,
               make_optimizer: OptimizerFactory = torch.optim.AdamW) -> WholeStep:
    """Compile the training step of a copy of ``model`` (see module), its parameters
    replicated or, with ``specs``, marked with them."""
    specs = specs or {}
    cpu = copy.deepcopy(model)
    spmd = copy.deepcopy(cpu).to("spmd")
    if hasattr(spmd, "tie_weights"):
        spmd.tie_weights()  # Module.to gives each use of a shared weight its own copy
    optimizer = _state_on_device(cpu, spmd, make_optimizer)
    for name, p in spmd.named_parameters():
        spec = specs.get(name, (None,) * p.dim())
        mark_sharding(p, mesh, spec)
        for value in optimizer.state[p].values():
            if isinstance(value, torch.Tensor) and value.device.type == "spmd" \
                    and value.shape == p.shape:
                mark_sharding(value, mesh, spec)
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
    for p, g in zip(params, grads):
        p.grad = g
    with torch.no_grad():
        optimizer.step()
    state = [v for p in params for v in optimizer.state[p].values()
             if isinstance(v, torch.Tensor) and v.device.type == "spmd"]
    outputs = [loss, *params, *state, *(g for g in grads if g is not None)]
    # Donated, as a compiled step updates its state in place (and its memory counts once).
    compiled = pending_program(outputs, donate=True).compile()
    costs = read_compiled(compiled, mesh.size())
    memory = costs.memory
    used = (memory.argument_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    return WholeStep(costs.flops, costs.bytes_accessed, costs.collectives, int(used), compiled)
