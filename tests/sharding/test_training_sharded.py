"""End to end: a small MLP trained data-parallel with FSDP-sharded weights matches CPU training."""

import copy

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

N = 8
STEPS = 10


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 16, generator=gen), torch.randn(16, 8, generator=gen))
            for _ in range(STEPS)]


def _fsdp_spec(p: torch.Tensor) -> tuple:
    """FSDP: shard the largest dim over 'fsdp' (as FSDPv2 does), replicate the others."""
    largest = list(p.shape).index(max(p.shape))
    return tuple("fsdp" if d == largest else None for d in range(p.dim()))


def _make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def _train_cpu(opt_name: str) -> list[float]:
    model = _model()
    opt = _make_optimizer(opt_name, model.parameters())
    losses = []
    for x, y in _batches():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _train_spmd(opt_name: str, mesh: Mesh):
    model = copy.deepcopy(_model()).to("spmd")
    for p in model.parameters():
        mark_sharding(p, mesh, _fsdp_spec(p))
    opt = _make_optimizer(opt_name, model.parameters())
    losses, compiled = [], []
    for x_cpu, y_cpu in _batches():
        x, y = x_cpu.to("spmd"), y_cpu.to("spmd")
        mark_sharding(x, mesh, ("data", None))
        mark_sharding(y, mesh, ("data", None))
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torchspmd.sync()
        losses.append(loss.item())
        compiled.append(torchspmd.metrics()["graphs_compiled"])
    return losses, compiled, model


@pytest.mark.parametrize("opt_name, mesh_shape", [("sgd", (2, 4)), ("adamw", (4, 2))])
def test_fsdp_training_matches_cpu_without_recompiling(opt_name, mesh_shape):
    mesh = Mesh(np.arange(N), mesh_shape, ("data", "fsdp"))
    losses, compiled, model = _train_spmd(opt_name, mesh)
    np.testing.assert_allclose(losses, _train_cpu(opt_name), rtol=1e-4)
    assert compiled[-1] == compiled[2], f"recompiled after step 3: {compiled}"
    weight = model[0].weight
    assert get_sharding(weight) == get_sharding(_marked_like(weight, mesh))


def _marked_like(p: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """A fresh tensor marked as ``p`` was at the start, to read the expected text."""
    fresh = torch.zeros(p.shape).to("spmd")
    mark_sharding(fresh, mesh, _fsdp_spec(p))
    return fresh
