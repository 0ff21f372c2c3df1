"""call_jax inside torchspmd.compile: the JAX function is part of the replayed program."""

import jax.numpy as jnp
import torch
import torch.nn.functional as F

import torchspmd


class JaxGelu(torch.nn.Module):
    def forward(self, x):
        return torchspmd.call_jax(lambda a: jnp.tanh(a) * a, x)


class TorchGelu(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x) * x


def _model(activation: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), activation, torch.nn.Linear(16, 1))


def test_a_compiled_step_with_call_jax_trains_as_on_cpu():
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(4)]
    cpu = _model(TorchGelu())
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    expected = []
    for x, y in data:
        cpu_opt.zero_grad()
        loss = F.mse_loss(cpu(x), y)
        loss.backward()
        cpu_opt.step()
        expected.append(loss.item())

    model = _model(JaxGelu()).to("spmd")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torchspmd.compile
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    before = torchspmd.metrics()["step_replays"]
    losses = [step(x.to("spmd"), y.to("spmd")).item() for x, y in data]
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert torchspmd.metrics()["step_replays"] - before >= 2  # replayed, not run lazily
