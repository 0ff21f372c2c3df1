"""What the distributed tests run, the same in the test process (one process, 8 devices)
and in each launched process (2 processes x 4 devices): a model sharded FSDP + TP, its
training, and the values whose reads are compared.

Everything is deterministic and identical in every process, as SPMD requires.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

import torchspmd
from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner, prime_optimizer
from torchspmd.sharding import Mesh, mark_sharding
from torchspmd.testing.models import MLP

SIZES = (16, 64, 64, 8)
BATCH = 16


def mesh_4x2() -> Mesh:
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def mesh_2x4() -> Mesh:
    """Another shape, listing the devices in reverse: every layout differs from 4x2's."""
    return Mesh(np.arange(8)[::-1].copy(), (2, 4), ("data", "model"))


def sharded_mlp(mesh: Mesh) -> tuple[MLP, torch.optim.AdamW]:
    """The seeded MLP on ``mesh``: columns then rows over 'model' (TP), the other weight
    dim over 'data' (FSDP); AdamW."""
    torch.manual_seed(0)
    model = MLP(SIZES).to(torchspmd.device())
    for i, layer in enumerate(model.layers):
        tp_first = i % 2 == 0  # column-parallel, then row-parallel
        mark_sharding(layer.weight, mesh, ("model", "data") if tp_first else ("data", "model"))
        mark_sharding(layer.bias, mesh, ("model",) if tp_first else (None,))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (a CPU tensor pair; depends only on ``step``)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, SIZES[0], generator=gen), torch.randn(BATCH, SIZES[-1], generator=gen)


def mse(model: MLP, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss (``loss_fn`` form: the model first)."""
    return torch.nn.functional.mse_loss(model(x), y)


def train(model: MLP, opt: torch.optim.Optimizer, mesh: Mesh, steps: range) -> list[float]:
    """AdamW steps on the batches of ``steps``, split over 'data'; the losses."""
    losses = []
    for step in steps:
        x, y = (t.to(torchspmd.device()) for t in batch(step))
        mark_sharding(x, mesh, ("data", None))
        mark_sharding(y, mesh, ("data", None))
        loss = mse(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torchspmd.sync()
        losses.append(loss.item())
    return losses


def train_compiled(model: MLP, opt: torch.optim.Optimizer, mesh: Mesh,
                   steps: range) -> list[float]:
    """``train``'s steps through ``torchspmd.compile`` (a warm-up, a capture, then one
    program per step), the learning rate halved each step by a scheduler; the losses."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)

    @torchspmd.compile
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = mse(model, x, y)
        loss.backward()
        opt.step()
        return loss

    losses = []
    for i in steps:
        x, y = (t.to(torchspmd.device()) for t in batch(i))
        mark_sharding(x, mesh, ("data", None))
        mark_sharding(y, mesh, ("data", None))
        losses.append(step(x, y).item())
        sched.step()
    return losses


def save(path: str, model: MLP, opt: torch.optim.Optimizer) -> None:
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path,
             planner=SPMDSavePlanner())


def load(path: str, model: MLP, opt: torch.optim.Optimizer) -> None:
    prime_optimizer(opt)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])


def sharded_value(mesh: Mesh) -> torch.Tensor:
    """A value computed on sharded data: its read is a gather across processes."""
    x = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8).to(torchspmd.device())
    mark_sharding(x, mesh, ("data", "model"))
    return (x @ x.T).sin() * 3
