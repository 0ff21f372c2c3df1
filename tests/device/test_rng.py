"""Device RNG: reproducible under a seed, new values every step, no recompiles."""

import pytest
import torch

import torchspmd
from torchspmd.runtime.metrics import COUNTERS

DRAWS = {
    "rand": lambda: torch.rand(1000, device="spmd"),
    "randn": lambda: torch.randn(1000, device="spmd"),
    "randint": lambda: torch.randint(0, 10, (1000,), device="spmd"),
    "randperm": lambda: torch.randperm(50, device="spmd"),
    "normal_": lambda: torch.empty(1000, device="spmd").normal_(2.0, 3.0),
    "uniform_": lambda: torch.empty(1000, device="spmd").uniform_(-1, 1),
    "bernoulli": lambda: torch.bernoulli(torch.full((1000,), 0.3, device="spmd")),
    "dropout": lambda: torch.nn.functional.dropout(torch.ones(1000, device="spmd"), 0.5),
}


@pytest.mark.parametrize("name", DRAWS)
def test_manual_seed_reproduces_draws(name):
    torch.manual_seed(7)
    first = DRAWS[name]().cpu()
    torch.manual_seed(7)
    assert torch.equal(DRAWS[name]().cpu(), first)


@pytest.mark.parametrize("name", DRAWS)
def test_each_draw_differs_without_recompiling(name):
    torch.manual_seed(0)
    first = DRAWS[name]().cpu()
    compiled = COUNTERS["graphs_compiled"]
    second = DRAWS[name]().cpu()
    assert not torch.equal(first, second)
    assert COUNTERS["graphs_compiled"] == compiled


def test_torchspmd_manual_seed_is_the_same_stream():
    torchspmd.manual_seed(3)
    a = torch.rand(10, device="spmd").cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.rand(10, device="spmd").cpu(), a)


def test_distributions_are_right():
    torch.manual_seed(0)
    normal = torch.randn(100_000, device="spmd").cpu()
    assert abs(normal.mean()) < 0.02 and abs(normal.std() - 1) < 0.02
    uniform = torch.rand(100_000, device="spmd").cpu()
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.01
    perm = torch.randperm(100, device="spmd").cpu()
    assert torch.equal(perm.sort().values, torch.arange(100))
    kept = torch.nn.functional.dropout(torch.ones(100_000, device="spmd"), 0.25).cpu()
    assert abs((kept > 0).float().mean() - 0.75) < 0.01
    assert torch.allclose(kept[kept > 0], torch.tensor(1 / 0.75))
