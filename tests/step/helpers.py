"""Tiny models and a CPU reference loop for the compiled-step tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torchspmd as xs

DEVICE = xs.device()


def mlp(device, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).to(device)


def batches(n: int = 4, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(n)]


def train_step(model, opt):
    """The usual step: zero_grad, forward, backward, optimizer step; returns the loss."""

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def cpu_losses(make_opt, data, sched=None) -> tuple[list[float], torch.nn.Module]:
    model = mlp("cpu")
    opt = make_opt(model.parameters())
    schedule = sched(opt) if sched else None
    step = train_step(model, opt)
    losses = [step(x, y).item() for x, y in data]
    if schedule:
        raise AssertionError("use cpu_losses_scheduled")
    return losses, model


def on_device(*tensors):
    return [t.to(DEVICE) for t in tensors]


def assert_params_close(a: torch.nn.Module, b: torch.nn.Module, tol: float = 1e-5) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=tol, atol=tol,
                                   msg=name)
