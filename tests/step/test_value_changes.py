"""A compiled step captured for many values of its non-tensor arguments (a decode loop
passing its position as an ``int``) compiles every call: correct, silently slow before.
At the 8th such signature a ``ValueRecompileWarning`` names the changing values and says
to pass them as tensors; a tensor position replays one program."""

from __future__ import annotations

import warnings

import torch

import torchspmd as xs
from torchspmd.step.value_changes import WARN_AFTER, ValueRecompileWarning

DEVICE = xs.device()


def _decoder():
    cache = torch.zeros(16, 4).to(DEVICE)

    def step(x, pos):
        if isinstance(pos, int):
            cache[pos] = x
        else:  # a position tensor, used through a tensor op
            cache.index_copy_(0, pos, x[None])
        return cache.sum(0)

    return cache, step


def _calls(step, positions) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for pos in positions:
            step(torch.full((4,), 1.0).to(DEVICE), pos)
    return [w for w in caught if w.category is ValueRecompileWarning]


def test_an_int_position_warns_once_naming_its_values():
    _, step = _decoder()
    caught = _calls(xs.compile(step), range(12))
    assert len(caught) == 1
    assert "captured and compiled for 8 signatures" in str(caught[0].message)
    assert "(0, 1, 2, 3, 4, ...)" in str(caught[0].message)
    assert "torch.tensor([pos], device='spmd')" in str(caught[0].message)


def test_a_tensor_position_replays_one_program_and_gives_the_same_values():
    cache, step = _decoder()
    compiled = xs.compile(step)
    xs.reset_metrics()
    caught = _calls(compiled, [torch.tensor([p]).to(DEVICE) for p in range(12)])
    assert not caught and xs.metrics()["step_captures"] <= 2
    assert cache.cpu()[:12].eq(1).all() and cache.cpu()[12:].eq(0).all()


def test_fewer_new_values_than_the_limit_say_nothing():
    _, step = _decoder()
    assert not _calls(xs.compile(step), list(range(WARN_AFTER - 1)) * 2)
