"""cdist / pdist and their backward ops against CPU PyTorch, every kind of p."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
P_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]
g = torch.Generator().manual_seed(0)
x1 = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
x2 = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
x2[:, 0] = x1[:, 1]  # a zero distance: its gradient is 0 by PyTorch's convention
rows = torch.randn(6, 3, generator=g, dtype=torch.float64)
rows[4] = rows[2]


@pytest.mark.parametrize("p", P_VALUES)
def test_cdist_forward(p):
    check_lowering(aten._cdist_forward.default, x1, x2, p, None)


def test_cdist_forward_by_matrix_multiply():
    check_lowering(aten._cdist_forward.default, x1, x2, 2.0, 1)


@pytest.mark.parametrize("p", P_VALUES)
def test_cdist_backward(p):
    dist = aten._cdist_forward(x1, x2, p, None)
    grad = torch.randn(dist.shape, generator=g, dtype=torch.float64)
    check_lowering(aten._cdist_backward.default, grad, x1, x2, p, dist)


@pytest.mark.parametrize("p", P_VALUES)
def test_pdist_forward(p):
    check_lowering(aten._pdist_forward.default, rows, p)


@pytest.mark.parametrize("p", P_VALUES)
def test_pdist_backward(p):
    dist = aten._pdist_forward(rows, p)
    grad = torch.randn(dist.shape, generator=g, dtype=torch.float64)
    check_lowering(aten._pdist_backward.default, grad, rows, p, dist)


def test_cdist_trains_on_the_device_like_cpu():
    a, b = x1.float().requires_grad_(True), x2.float().requires_grad_(True)
    da, db = (t.detach().to("spmd").requires_grad_(True) for t in (a, b))
    torch.cdist(a, b).sum().backward()
    torch.cdist(da, db).sum().backward()
    torch.testing.assert_close(da.grad.cpu(), a.grad)
    torch.testing.assert_close(db.grad.cpu(), b.grad)
