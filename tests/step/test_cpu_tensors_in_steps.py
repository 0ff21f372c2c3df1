"""A CPU tensor a compiled step reads (a 0-d scale, an index, ``t.to(device)``) is a
constant of its capture, as a closed-over array is in ``jax.jit``; changed in place since
(its ``_version`` moved), the next call captures again and computes with the new value,
where a replay used to compute with the old one without a word."""

from __future__ import annotations

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
