"""A compiled step whose program fails to compile or run (issue 20 §3): the call raises,
the model's state keeps the values it had before the call, and the next call works."""

import pytest
import torch

import torchspmd as xs
import torchspmd.step.plan as plan_module
from tests.step.helpers import DEVICE, assert_params_close, batches, mlp, on_device, train_step


def _failing_compiles(monkeypatch, count: int) -> None:
    """The next ``count`` programs compiled steps compile fail, as XLA's memory check
    fails a program that does not fit."""
    real = plan_module.Plan._compile
    left = [count]

    def compile_(self, *args):
        if left[0] > 0:
            left[0] -= 1
            raise torch.OutOfMemoryError("injected: the step does not fit")
        return real(self, *args)

    monkeypatch.setattr(plan_module.Plan, "_compile", compile_)


@pytest.mark.parametrize("failures", [1, 2])
def test_after_failed_calls_state_keeps_its_values_and_the_next_call_trains_on(
        monkeypatch, failures):
    # Plain SGD: no state created on first use, so the first call is captured and compiled
    # (not a warm-up run lazily).
    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = xs.compile(train_step(model, opt))
    data = batches(failures + 2)
    initial = [p.detach().cpu().clone() for p in model.parameters()]
    _failing_compiles(monkeypatch, failures)
    for x, y in data[:failures]:
        with pytest.raises(torch.OutOfMemoryError, match="injected"):
            step(*on_device(x, y))
        for p, q in zip(model.parameters(), initial):
            torch.testing.assert_close(p.detach().cpu(), q, rtol=0, atol=0)
            assert p.grad is None
    cpu = mlp("cpu")
    cpu_step = train_step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1))
    for x, y in data[failures:]:  # the failed calls never happened
        torch.testing.assert_close(step(*on_device(x, y)).cpu(), cpu_step(x, y))
    assert_params_close(model, cpu)


def test_a_replay_that_fails_to_launch_keeps_state_and_the_next_replay_works():
    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = xs.compile(train_step(model, opt))
    cpu = mlp("cpu")
    cpu_step = train_step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9))
    data = batches(4)
    for x, y in data[:2]:
        step(*on_device(x, y)), cpu_step(x, y)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    plan = step._last
    real, plan.compiled = plan.compiled, _raises
    with pytest.raises(RuntimeError, match="device lost"):
        step(*on_device(*data[2]))
    plan.compiled = real
    for p, q in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=0, atol=0)
    for x, y in data[2:]:
        torch.testing.assert_close(step(*on_device(x, y)).cpu(), cpu_step(x, y))
    assert_params_close(model, cpu)


def _raises(*args):
    raise RuntimeError("device lost (injected)")
