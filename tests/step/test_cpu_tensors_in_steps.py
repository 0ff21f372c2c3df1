"""A CPU tensor a compiled step reads (a 0-d scale, an index, ``t.to(device)``) is a
constant of its capture, as a closed-over array is in ``jax.jit``; changed in place since
(its ``_version`` moved), the next call captures again and computes with the new value,
where a replay used to compute with the old one without a word."""

from __future__ import annotations

import copy

import pytest
import torch

import torchspmd

DEV = torchspmd.device()
X = torch.arange(12.0).reshape(3, 4)


def _recaptures() -> int:
    return torchspmd.metrics()["step_recaptures_state"]


def test_a_0d_scale_changed_in_place_is_read_again():
    scale = torch.tensor(2.0)
    step = torchspmd.compile(lambda x: x * scale)
    x = X.to(DEV)
    before = _recaptures()
    got = [step(x).cpu(), step(x).cpu()]
    scale.fill_(3.0)
    got += [step(x).cpu(), step(x).cpu()]
    for value, result in zip((2.0, 2.0, 3.0, 3.0), got):
        torch.testing.assert_close(result, X * value, rtol=0, atol=0)
    assert _recaptures() - before == 1  # once, after the change


def test_cpu_indices_changed_in_place_are_read_again():
    rows = torch.tensor([0, 2])
    step = torchspmd.compile(lambda x: x[rows] + 1)
    x = X.to(DEV)
    torch.testing.assert_close(step(x).cpu(), X[[0, 2]] + 1)
    rows[1] = 1
    torch.testing.assert_close(step(x).cpu(), X[[0, 1]] + 1)


def test_a_mask_moved_to_the_device_inside_the_step_follows_its_changes():
    mask = torch.tensor([True, False, True])
    step = torchspmd.compile(lambda x: x * mask.to(DEV)[:, None])
    x = X.to(DEV)
    torch.testing.assert_close(step(x).cpu(), X * mask[:, None])
    mask[1] = True
    torch.testing.assert_close(step(x).cpu(), X * mask[:, None])


def test_a_cpu_tensor_made_inside_the_step_keeps_replaying():
    step = torchspmd.compile(lambda x: x * torch.tensor(1.5))
    x = X.to(DEV)
    before = _recaptures()
    for _ in range(3):
        torch.testing.assert_close(step(x).cpu(), X * 1.5)
    assert _recaptures() == before


# A CPU tensor the step *changes* (a counter, Adagrad's step count) would change on the
# capturing call only: a replay runs the device program and no CPU op. Refused at capture,
# naming the tensor, where it used to fall behind by one per call without a word.

class _CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.calls = torch.zeros(())  # a plain attribute: .to(device) leaves it on the CPU

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_a_cpu_counter_the_step_changes_in_place_is_refused_by_name():
    model = _CountsCalls().to(DEV)
    step = torchspmd.compile(lambda x: model(x).sum())
    with pytest.raises(torchspmd.step.HostStateError, match=r"_CountsCalls\.calls, a CPU tensor"):
        step(X.to(DEV))
    assert model.calls.item() == 1  # the call ran once, as on the lazy path


def test_a_cpu_tensor_rebound_in_its_slot_is_refused():
    model = _CountsCalls().to(DEV)

    def forward(x):
        model.calls = model.calls + 1
        return model.lin(x).sum()

    with pytest.raises(torchspmd.step.HostStateError, match=r"_CountsCalls\.calls"):
        torchspmd.compile(forward)(X.to(DEV))


class _CountsOnTheCpu(torch.optim.SGD):
    """An optimizer keeping a per-parameter CPU counter in its state."""

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].setdefault("calls", torch.zeros(())).add_(1)
        return super().step(closure)


def test_an_optimizers_cpu_state_the_step_changes_is_refused_naming_it():
    model = torch.nn.Linear(4, 2).to(DEV)
    opt = _CountsOnTheCpu(model.parameters(), lr=0.1)

    @torchspmd.compile
    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    step(X.to(DEV))  # the counter is made here: nothing to compare it with yet
    with pytest.raises(torchspmd.step.HostStateError,
                       match=r"(?s)_CountsOnTheCpu\.state\[<tensor of shape \(2, 4\)>\]\['calls'\]"
                             r".*_CountsOnTheCpu keeps it on the CPU"):
        step(X.to(DEV))


def test_adagrad_keeps_its_step_count_on_the_device_and_trains_like_cpu():
    """Adagrad has no capturable option; its count moves to the device (``optim.py``)."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 2)
    model = copy.deepcopy(cpu).to(DEV)
    opts = [torch.optim.Adagrad(m.parameters(), lr=0.1, lr_decay=0.05) for m in (cpu, model)]

    def step(m, opt, x):
        opt.zero_grad()
        m(x).square().sum().backward()
        opt.step()

    compiled = torchspmd.compile(lambda x: step(model, opts[1], x))
    for _ in range(4):
        step(cpu, opts[0], X)
        compiled(X.to(DEV))
    for p_cpu, p in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu)
        # A float64 count on the device (``optim.COUNT_DTYPE``), the same number.
        assert opts[1].state[p]["step"].item() == opts[0].state[p_cpu]["step"].item() == 4.0


def test_a_cpu_tensor_the_step_only_reads_is_not_refused():
    model = _CountsCalls().to(DEV)
    step = torchspmd.compile(lambda x: model.lin(x).sum() + model.calls.to(DEV))
    for _ in range(2):
        torch.testing.assert_close(step(X.to(DEV)).cpu(),
                                   (X @ model.lin.weight.cpu().T + model.lin.bias.cpu()).sum())
