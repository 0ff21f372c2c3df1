"""Gradients of the multi-class margin losses on the device against CPU PyTorch."""

import pytest
import torch
import torch.nn.functional as F

g = torch.Generator().manual_seed(0)
x = torch.randn(4, 5, generator=g)
labels = torch.tensor([0, 3, 4, 1])
multilabels = torch.tensor([[1, -1, 0, 0, 0], [0, 2, 4, -1, 0], [3, 3, -1, 1, 1], [-1, 0, 0, 0, 0]])


def _grads(loss, inputs, *rest):
    out = []
    for device in ("cpu", "spmd"):
        t = inputs.detach().to(device).requires_grad_(True)
        value = loss(t, *(r.to(device) if isinstance(r, torch.Tensor) else r for r in rest))
        (value * torch.arange(1.0, value.numel() + 1).reshape(value.shape).to(device)).sum().backward()
        out.append((value.cpu(), t.grad.cpu()))
    torch.testing.assert_close(out[1], out[0])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss_gradient(p, reduction):
    _grads(lambda t, y: F.multi_margin_loss(t, y, p=p, margin=0.7, reduction=reduction), x, labels)


def test_multi_margin_loss_gradient_with_class_weights():
    w = torch.rand(5, generator=g)
    _grads(lambda t, y, w: F.multi_margin_loss(t, y, weight=w), x, labels, w)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_gradient(reduction):
    _grads(lambda t, y: F.multilabel_margin_loss(t, y, reduction=reduction), x, multilabels)


def test_multilabel_margin_loss_gradient_of_one_sample():
    _grads(lambda t, y: F.multilabel_margin_loss(t, y), x[1], multilabels[1])
