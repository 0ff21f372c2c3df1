"""A Python number the step reads, changed between calls (a module's temperature, a
global loss weight), gives the new value: a replay runs the capture's program, which
holds the number as the capture read it, so the step is captured again when one changed
(the same graph reuses its compiled program). Before, replays kept the first value
(temperature 0.5 and 0.25 gave the result of 1.0). A number the step itself changes is
refused (``test_errors.py``)."""

from __future__ import annotations

import torch

import torchspmd as xs

DEVICE = xs.device()
LOSS_WEIGHT = 2.0


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.temperature = 1.0

    def forward(self, x):
        return (self.linear(x) / self.temperature).sum()


def test_a_module_attribute_changed_between_calls_is_read_anew():
    torch.manual_seed(0)
    cpu = _Scaled()
    model = _Scaled().to(DEVICE)
    model.load_state_dict(cpu.state_dict())
    step = xs.compile(lambda x: model(x))
    x = torch.ones(2, 3)
    for temperature in (1.0, 1.0, 0.5, 0.25, 0.25):
        model.temperature = cpu.temperature = temperature
        torch.testing.assert_close(step(x.to(DEVICE)).cpu(), cpu(x))


def test_a_global_changed_between_calls_is_read_anew():
    global LOSS_WEIGHT

    @xs.compile
    def step(x):
        return (x * LOSS_WEIGHT).sum()

    x = torch.ones(3)
    for weight in (2.0, 3.0, 3.0):
        LOSS_WEIGHT = weight
        assert step(x.to(DEVICE)).item() == 3 * weight


def test_unchanged_numbers_keep_replaying():
    model = _Scaled().to(DEVICE)
    step = xs.compile(lambda x: model(x))
    step(torch.ones(2, 3).to(DEVICE))
    before = xs.metrics()
    for _ in range(3):
        step(torch.ones(2, 3).to(DEVICE))
    after = xs.metrics()
    assert after["step_replays"] - before["step_replays"] == 3
    assert after["step_captures"] == before["step_captures"]


step = 0  # a module-level loop variable, as in ``for step in range(n)``


def test_a_global_named_like_a_method_the_step_calls_is_not_read_by_it():
    """``opt.step()`` names the attribute ``step``; the walk took every name in the
    code's ``co_names`` for a global it reads, so a ``for step in ...`` loop at module
    level made every call capture again (the docs' own example replayed no call)."""
    global step
    model = torch.nn.Linear(3, 1).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @xs.compile
    def train(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    before = xs.metrics()
    for step in range(5):
        train(torch.ones(2, 3).to(DEVICE))
    assert xs.metrics()["step_replays"] - before["step_replays"] >= 3
