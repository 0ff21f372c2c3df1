"""PyTorch/XLA's training helpers as torchspmd serves them, against CPU PyTorch:
``torch_xla.experimental.gradient_accumulation`` (its XLA ``While`` loop's values, from a
loop recorded unrolled) and ``torch_xla.utils.checkpoint``. Every gradient is compared.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchspmd
from torchspmd.compat.torch_xla.experimental.gradient_accumulation import gradient_accumulation
from torchspmd.compat.torch_xla.utils.checkpoint import checkpoint

DEV = torchspmd.device()
STEPS = 4


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        self.unused = nn.Linear(2, 2)  # no step reads it: PyTorch/XLA gives it zero grads

    def forward(self, x):
        return self.body(x)


def _models():
    torch.manual_seed(0)
    cpu = WithUnused().double()
    return cpu, copy.deepcopy(cpu).to(DEV)


def _data():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(STEPS, 5, 6, generator=g, dtype=torch.float64),
            torch.randn(STEPS, 5, 3, generator=g, dtype=torch.float64))


def _cpu_reference(model, x, y, kept=None):
    """PyTorch/XLA's semantics, written out: loss / steps backpropagated per step, the
    step gradients summed and added to what ``.grad`` held, the scaled losses summed."""
    total, sums = torch.zeros((), dtype=torch.float64), None
    for i in range(STEPS):
        model.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x[i]), y[i]) / STEPS
        loss.backward()
        total = total + loss.detach()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p)
                 for p in model.parameters()]
        sums = grads if sums is None else [a + b for a, b in zip(sums, grads)]
    for p, s, k in zip(model.parameters(), sums, kept or [None] * len(sums)):
        p.grad = s if k is None else k + s
    return total


def _assert_grads_equal(cpu, dev):
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        assert b.grad is not None, name
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_gradient_accumulation_sums_each_steps_scaled_gradients_as_pytorch_xla():
    cpu, dev = _models()
    x, y = _data()
    expected = _cpu_reference(cpu, x, y)
    loss = gradient_accumulation(lambda a, b: F.mse_loss(dev(a), b), (x.to(DEV), y.to(DEV)),
                                 dev)
    assert loss.dtype == torch.float64 and loss.shape == ()  # the loss's (PyTorch/XLA: float32)
    torch.testing.assert_close(loss.cpu(), expected)
    _assert_grads_equal(cpu, dev)
    assert dev.unused.weight.grad.abs().sum().item() == 0


def test_gradient_accumulation_adds_to_the_gradients_already_there():
    cpu, dev = _models()
    x, y = _data()
    F.mse_loss(cpu(x[0] * 2), y[0]).backward()
    F.mse_loss(dev(x[0].to(DEV) * 2), y[0].to(DEV)).backward()
    kept = [p.grad.clone() if p.grad is not None else None for p in cpu.parameters()]
    _cpu_reference(cpu, x, y, kept)
    gradient_accumulation(lambda a, b: F.mse_loss(dev(a), b), (x.to(DEV), y.to(DEV)), dev)
    _assert_grads_equal(cpu, dev)


def test_carried_tensors_pass_from_step_to_step_and_come_back():
    cpu, dev = _models()
    x, y = _data()

    def step(a, b, count, total):
        loss = F.mse_loss(dev(a), b)
        return loss, count + 1, total + loss.detach()

    loss, count, total = gradient_accumulation(
        step, (x.to(DEV), y.to(DEV)), dev, torch.zeros((), device=DEV),
        torch.zeros((), dtype=torch.float64, device=DEV))
    assert count.item() == STEPS
    losses = [F.mse_loss(cpu(x[i]), y[i]).item() for i in range(STEPS)]
    assert total.item() == pytest.approx(sum(losses), rel=1e-12)
    assert loss.item() == pytest.approx(sum(losses) / STEPS, rel=1e-12)


def test_gradient_accumulation_inside_a_compiled_step_replays_cpus_values():
    cpu, dev = _models()
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)

    @torchspmd.compile
    def train(a, b):
        loss = gradient_accumulation(lambda p, q: F.mse_loss(dev(p), q), (a, b), dev)
        opt_dev.step()
        opt_dev.zero_grad()
        return loss

    for seed in range(3):
        x, y = (t * (seed + 1) for t in _data())
        expected = _cpu_reference(cpu, x, y)
        opt_cpu.step()
        opt_cpu.zero_grad()
        torch.testing.assert_close(train(x.to(DEV), y.to(DEV)).cpu(), expected)
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-12, atol=1e-12)


def test_a_failed_step_leaves_the_gradients_as_they_were():
    _, dev = _models()
    x, y = _data()
    F.mse_loss(dev(x[0].to(DEV)), y[0].to(DEV)).backward()
    before = [p.grad.cpu() if p.grad is not None else None for p in dev.parameters()]

    def step(a, b):
        if step.calls == 2:
            raise KeyboardInterrupt
        step.calls += 1
        return F.mse_loss(dev(a), b)

    step.calls = 0
    with pytest.raises(KeyboardInterrupt):
        gradient_accumulation(step, (x.to(DEV), y.to(DEV)), dev)
    for p, g in zip(dev.parameters(), before):
        assert (p.grad is None) == (g is None)
        if g is not None:
            torch.testing.assert_close(p.grad.cpu(), g)


@pytest.mark.parametrize("bad, message", [
    ((), "cannot be empty"),
    ((torch.ones(3, 2), torch.ones(2, 2)), "element 1 .* 2 steps .* element 0 has 3"),
    ((torch.ones(0, 2),), "element 0 of iterable_tensors is empty"),
])
def test_inconsistent_inputs_are_refused_naming_the_element(bad, message):
    with pytest.raises(ValueError, match=message):
        gradient_accumulation(lambda *a: None, tuple(t.to(DEV) for t in bad), nn.Linear(2, 2))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_recomputes_with_cpus_gradients(use_reentrant):
    cpu, dev = _models()
    x = _data()[0][0]
    checkpoint(cpu.body, x.requires_grad_(True), use_reentrant=use_reentrant).sum().backward()
    xd = x.detach().to(DEV).requires_grad_(True)
    checkpoint(dev.body, xd, use_reentrant=use_reentrant).sum().backward()
    for a, b in zip(cpu.body.parameters(), dev.body.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-12, atol=1e-12)


def test_checkpoint_refuses_keywords_pytorch_xla_refuses():
    with pytest.raises(ValueError, match="unexpected keyword arguments: determinism_check"):
        checkpoint(torch.sin, torch.ones(2, device=DEV), determinism_check="none")
