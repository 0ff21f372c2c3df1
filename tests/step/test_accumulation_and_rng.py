"""Gradient accumulation across calls, and dropout's fresh, reproducible draws."""

import torch
import torch.nn.functional as F

import torchspmd as xs
from tests.step.helpers import (DEVICE, assert_params_close, batches, mlp, on_device,
                                train_step)


def _accumulating(model, opt):
    """Two micro-batches per optimizer step: the first call only accumulates p.grad."""

    def micro(x, y):
        loss = F.mse_loss(model(x), y) / 2
        loss.backward()
        return loss

    def update():
        opt.step()
        opt.zero_grad()

    return micro, update


def test_gradients_accumulate_across_compiled_calls_as_on_cpu():
    data = batches(6)
    results = []
    for device, compiled in (("cpu", False), (DEVICE, True)):
        model = mlp(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        micro, update = _accumulating(model, opt)
        micro = xs.compile(micro) if compiled else micro
        for i, (x, y) in enumerate(data):
            micro(*((x, y) if device == "cpu" else on_device(x, y)))
            if i % 2 == 1:
                update()
        results.append(model)
    assert_params_close(results[1], results[0])


class _Dropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(64))

    def forward(self, x):
        return F.dropout(x * self.scale, p=0.5, training=True)


def _masks(seed: int, calls: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    module = _Dropout().to(DEVICE)
    step = xs.compile(lambda x: module(x) != 0)
    x = torch.ones(64).to(DEVICE)
    return [step(x).cpu() for _ in range(calls)]


def test_dropout_draws_a_new_mask_every_call():
    masks = _masks(0, 4)
    assert all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))
    assert xs.metrics()["step_replays"] >= 3


def test_manual_seed_reproduces_the_masks_of_a_compiled_step():
    assert all(torch.equal(a, b) for a, b in zip(_masks(7, 3), _masks(7, 3)))


def test_a_seed_gives_the_same_draws_whether_the_call_captures_replays_or_runs_lazily():
    """``torch.manual_seed(s)`` before a call fixes its draws: the capture drew one seed
    per random op in the order they were recorded and then ran with fresh ones, and
    replays handed the seeds out in the graph's node order (two ops swapped theirs)."""
    def draws(x):
        return F.dropout(x, 0.5, training=True) + torch.rand_like(x)

    step = xs.compile(draws)
    x = torch.ones(32).to(DEVICE)
    results = []
    for run in (draws, step, step, step):  # lazy, capture, replay, replay
        torch.manual_seed(3)
        results.append(run(x).cpu())
    assert all(torch.equal(results[0], r) for r in results[1:])
    assert not torch.equal(step(x).cpu(), results[0])  # the stream moved on


def test_compiled_training_with_dropout_equals_the_lazy_path_mask_for_mask():
    """With one seed, every call draws as the lazy path does (warm-up, capture, replays):
    AdamW training through two dropouts gives the lazy run's losses and parameters."""
    def run(compiled: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.3), torch.nn.Linear(32, 4),
                                    torch.nn.Dropout(0.1)).to(DEVICE)
        step = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        run_step = xs.compile(step) if compiled else step
        torch.manual_seed(123)
        losses = [run_step(*on_device(x, y)).item() for x, y in batches(5)]
        return losses, [p.detach().cpu() for p in model.parameters()]

    (lazy_losses, lazy_params), (losses, params) = run(False), run(True)
    assert losses == lazy_losses
    assert all(torch.equal(a, b) for a, b in zip(params, lazy_params))
