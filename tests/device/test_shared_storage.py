"""Tensors that share another's storage, as on CPU: ``t.data = x`` and ``t.set_(x)`` (``t``
keeps its identity, ``requires_grad`` and gradient path and shares ``x``'s storage from
then on), and ``copy.copy(t)``. ``Module.to(dtype)``, ``.half()``, ``.double()`` and
``.bfloat16()`` assign every parameter's ``.data``: before, an spmd tensor kept its old
value under the new dtype or shape without a word; ``set_`` failed at the next read and
``copy.copy`` returned a CPU copy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import torchspmd
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

DEV = torchspmd.device()


def test_assigning_data_gives_the_tensor_the_new_value():
    for dev in ("cpu", DEV):
        p = nn.Parameter(torch.ones(2, 3).to(dev))
        p.data = p.data * 2
        assert p.detach().cpu().tolist() == [[2.0] * 3] * 2
        assert isinstance(p, nn.Parameter) and p.requires_grad


def test_the_tensor_and_the_assigned_one_share_storage():
    p = nn.Parameter(torch.ones(2).to(DEV))
    q = torch.zeros(2).to(DEV)
    p.data = q
    q.add_(1)
    assert p.detach().cpu().tolist() == [1.0, 1.0]
    p.data.add_(1)
    assert q.cpu().tolist() == [2.0, 2.0]


def test_a_view_assigned_follows_its_base():
    base = torch.arange(6.0).reshape(3, 2).to(DEV)
    p = nn.Parameter(torch.zeros(2).to(DEV))
    p.data = base[1]
    base.mul_(10)
    assert p.detach().cpu().tolist() == [20.0, 30.0]


def test_another_shape_and_its_layout_come_with_the_data_and_gradients_follow():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    q = torch.full((8, 2), 3.0).to(DEV)
    mark_sharding(q, mesh, ("data", None))
    p = nn.Parameter(torch.ones(4, 2).to(DEV))
    p.data = q
    assert tuple(p.shape) == (8, 2) and get_sharding(p) == get_sharding(q)
    (p * p).sum().backward()
    assert p.grad.cpu().tolist() == [[6.0, 6.0]] * 8


def test_data_from_another_device_is_refused_and_the_tensor_keeps_its_value():
    p = nn.Parameter(torch.ones(2).to(DEV))
    with pytest.raises(RuntimeError, match=r"t.data = x needs x on the spmd device.*x.to\('spmd'\)"):
        p.data = torch.zeros(2)
    assert p.detach().cpu().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("convert", ["double", "half", "bfloat16", "to float64"])
def test_converting_a_module_on_the_device_matches_cpu(convert):
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    spmd = copy.deepcopy(cpu).to(DEV)
    for module in (cpu, spmd):
        if convert == "to float64":
            module.to(torch.float64)
        else:
            getattr(module, convert)()
    dtype = cpu[0].weight.dtype
    x = torch.randn(5, 4).to(dtype)
    for p, q in zip(spmd.parameters(), cpu.parameters()):
        assert p.dtype == q.dtype and p.handle.meta.dtype == q.dtype
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=0)
    torch.testing.assert_close(spmd(x.to(DEV)).detach().cpu(), cpu(x).detach(),
                               rtol=1e-2 if dtype in (torch.half, torch.bfloat16) else 1e-6,
                               atol=1e-3 if dtype in (torch.half, torch.bfloat16) else 1e-7)


def test_training_after_assigning_data_matches_cpu():
    """A training loop whose weights are replaced with ``p.data = ...`` between steps (a
    re-initialisation, an averaging scheme) goes on from the new values, compiled too."""
    def run(dev, compiled):
        torch.manual_seed(0)
        model = nn.Linear(4, 4).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return loss

        step = torchspmd.compile(step) if compiled else step
        g = torch.Generator().manual_seed(1)
        losses = []
        for i in range(4):
            losses.append(float(step(torch.randn(2, 4, generator=g).to(dev)).detach()))
            if i == 1:
                model.weight.data = model.weight.data * 2
        return losses, model.weight.detach().cpu()

    want_losses, want_weight = run("cpu", False)
    for compiled in (False, True):
        losses, weight = run(DEV, compiled)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        torch.testing.assert_close(weight, want_weight, rtol=1e-5, atol=1e-6)


def test_set_shares_the_source_storage_and_storage_sources_are_refused():
    a = torch.zeros(2, 2).to(DEV)
    b = torch.arange(6.0).to(DEV)
    assert a.set_(b) is a and tuple(a.shape) == (6,)
    b.add_(1)
    assert a.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    with pytest.raises(NotImplementedError, match=r"Tensor.set_ with a storage.*t.set_\(other_tensor\)"):
        a.set_()


def test_a_shallow_copy_stays_on_the_device_and_shares_storage():
    t = torch.arange(3.0).to(DEV)
    p = nn.Parameter(torch.ones(2).to(DEV))
    u, q = copy.copy(t), copy.copy(p)
    t.add_(1)
    assert u.device == DEV and u.cpu().tolist() == [1.0, 2.0, 3.0]
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.device == DEV


def test_assigning_data_inside_a_compiled_step_says_to_write_in_place():
    """A replay writes each new value into a storage the step read; a tensor moved to
    another storage mid-step would have none, so the step is refused, naming the fix."""
    p = nn.Parameter(torch.ones(2).to(DEV))

    @torchspmd.compile
    def step(x):
        with torch.no_grad():
            p.data = p.data * x
        return p.sum()

    with pytest.raises(RuntimeError, match=r"inside a compiled step.*t.copy_\(x\)"):
        step(torch.full((2,), 3.0).to(DEV))
