"""Hugging Face families: one training step on a 4x2 mesh with the batch sharded over
'data' gives CPU's loss and every parameter's gradient.

Each family of ``tests/hf/families.py`` runs twice where it takes an attention mask: with
a full batch, and with a padded one (row 0 padded on the left, row 1 on the right, labels
-100 on padding). Gradients are judged against the largest gradient of the model, so a
gradient that is zero in exact arithmetic does not fail on rounding noise.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import torchspmd as xs
from tests.hf.families import FAMILIES, Family

GRAD_RTOL = 1e-5  # of the largest |gradient| over all parameters


def _cases() -> list:
    cases = []
    for family in FAMILIES:
        for padded in ((False, True) if family.masked else (False,)):
            cases.append(pytest.param(family, padded,
                                      id=f"{family.name}-{'padded' if padded else 'full'}"))
    return cases


@pytest.fixture(scope="module")
def mesh():
    return xs.Mesh(np.arange(8), (4, 2), ("data", "model"))


def _on_device(inputs: dict, mesh: xs.Mesh) -> dict:
    """The batch on the device, every tensor's first (batch) dim sharded over 'data'."""
    placed = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(xs.device())
            xs.mark_sharding(value, mesh, ("data",) + (None,) * (value.dim() - 1))
        placed[key] = value
    return placed


@pytest.mark.parametrize("family,padded", _cases())
def test_sharded_batch_step_matches_cpu(family: Family, padded: bool, mesh):
    cpu = family.model()
    model = copy.deepcopy(cpu).to(xs.device())
    inputs = family.inputs(padded)
    expected = cpu(**inputs).loss
    expected.backward()
    loss = model(**_on_device(inputs, mesh)).loss
    loss.backward()
    xs.sync()  # the loss and every gradient come from one compiled program

    torch.testing.assert_close(loss.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    cpu_grads = dict(cpu.named_parameters())
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert {n for n, g in grads.items() if g is None} == {n for n, p in cpu_grads.items() if p.grad is None}
    scale = max(p.grad.abs().max().item() for p in cpu_grads.values() if p.grad is not None)
    assert scale > 0
    errors = {name: (grads[name].cpu() - p.grad).abs().max().item() / scale
              for name, p in cpu_grads.items() if p.grad is not None}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_RTOL, f"{worst}: max |grad - cpu| = {errors[worst]:.2e} x max |cpu grad|"
