"""call_jax inside torchspmd.compile: the JAX function is part of the replayed program."""

import jax.numpy as jnp
import torch

import torchspmd
from tests.step.helpers import train_step
from torchspmd.testing.models import adamw_reference_losses


class TanhGate(torch.nn.Module):
    """x * tanh(x), through JAX when ``jax`` is set, else in PyTorch."""

    def __init__(self, jax: bool):
        super().__init__()
        self.jax = jax

    def forward(self, x):
        if self.jax:
            return torchspmd.call_jax(lambda a: jnp.tanh(a) * a, x)
        return torch.tanh(x) * x


def _model(jax: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), TanhGate(jax), torch.nn.Linear(16, 1))


def test_a_compiled_step_with_call_jax_trains_as_on_cpu():
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(4)]
    expected = adamw_reference_losses(_model(jax=False), data)
    model = _model(jax=True).to("spmd")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    step = torchspmd.compile(train_step(model, opt))
    before = torchspmd.metrics()["step_replays"]
    losses = [step(x.to("spmd"), y.to("spmd")).item() for x, y in data]
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert torchspmd.metrics()["step_replays"] - before >= 2  # replayed, not run lazily
