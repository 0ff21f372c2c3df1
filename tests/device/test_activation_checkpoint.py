"""``torch.utils.checkpoint``: recomputation in backward, on CPU tensors and on the device."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchspmd


def block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


def grads(model: nn.Module, x: torch.Tensor, **checkpoint_args) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = checkpoint(model, x, **checkpoint_args) if checkpoint_args else model(x)
    out.square().sum().backward()
    return [x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]


def test_checkpoint_on_cpu_tensors_works_with_torchspmd_imported():
    # checkpoint saves the autocast state of every device type, the spmd one included.
    x = torch.randn(4, 8)
    expected = grads(block(), x)
    for actual, want in zip(grads(block(), x, use_reentrant=False), expected):
        torch.testing.assert_close(actual, want)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_on_the_device_gives_cpus_gradients(use_reentrant):
    x = torch.randn(4, 8)
    expected = grads(block(), x)
    actual = grads(block().to(torchspmd.device()), x.to(torchspmd.device()),
                   use_reentrant=use_reentrant)
    for a, want in zip(actual, expected):
        torch.testing.assert_close(a, want, atol=1e-5, rtol=1e-5)
