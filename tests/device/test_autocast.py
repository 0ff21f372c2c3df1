"""``torch.autocast("spmd", dtype=torch.bfloat16)`` follows CUDA's autocast lists."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchspmd

DEV = torchspmd.device()


def autocast():
    return torch.autocast("spmd", dtype=torch.bfloat16)


def test_matmuls_run_in_bfloat16():
    lin = nn.Linear(8, 4).to(DEV)
    x = torch.randn(2, 8, device=DEV)
    with autocast():
        assert lin(x).dtype == torch.bfloat16
        assert (x @ x.T).dtype == torch.bfloat16
        assert torch.bmm(x[None], x.T[None]).dtype == torch.bfloat16


def test_float32_list_ops_stay_float32_on_bfloat16_inputs():
    x = torch.randn(2, 8, device=DEV).bfloat16()
    with autocast():
        assert x.softmax(-1).dtype == torch.float32
        assert x.exp().dtype == torch.float32
        assert F.layer_norm(x, (8,)).dtype == torch.float32
        assert x.sum().dtype == torch.float32
        assert F.cross_entropy(x, torch.tensor([0, 1], device=DEV)).dtype == torch.float32


def test_other_ops_keep_their_input_dtype_and_promote_as_usual():
    x = torch.randn(2, 8, device=DEV).bfloat16()
    y = torch.randn(2, 8, device=DEV)
    with autocast():
        assert x.relu().dtype == torch.bfloat16
        assert (x + y).dtype == torch.float32
        assert torch.cat([x, y]).dtype == torch.float32  # widest input type


def test_float64_and_cpu_tensors_are_not_cast():
    with autocast():
        d = torch.randn(2, 2, device=DEV, dtype=torch.float64)
        assert (d @ d).dtype == torch.float64
        c = torch.randn(2, 2)
        assert (c @ c).dtype == torch.float32


def test_outside_autocast_nothing_is_cast():
    lin = nn.Linear(8, 4).to(DEV)
    with autocast():
        pass
    assert lin(torch.randn(2, 8, device=DEV)).dtype == torch.float32


def test_gradients_come_back_in_the_parameters_dtype():
    lin = nn.Linear(8, 4).to(DEV)
    with autocast():
        lin(torch.randn(2, 8, device=DEV)).float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32


def _mixed_precision_losses(device) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(5):
        x = torch.randn(8, 16, generator=gen).to(device)
        y = torch.randint(0, 4, (8,), generator=gen).to(device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        assert loss.dtype == torch.float32
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_mixed_precision_training_matches_cpu_autocast():
    np.testing.assert_allclose(_mixed_precision_losses(DEV), _mixed_precision_losses("cpu"),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_under_the_forwards_autocast(use_reentrant):
    lin = nn.Linear(8, 8).to(DEV)
    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    with autocast():
        y = torch.utils.checkpoint.checkpoint(lin, x, use_reentrant=use_reentrant)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32
