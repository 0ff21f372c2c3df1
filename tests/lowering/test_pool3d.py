"""3-d pooling lowerings and their backward ops against CPU PyTorch."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
x = torch.randn(2, 3, 5, 6, 7, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("args", [
    ((2, 2, 2), (), (0, 0, 0), False, True, None),
    ((3, 2, 3), (2, 1, 2), (1, 0, 1), True, False, None),
    ((3, 3, 3), (2, 2, 2), (1, 1, 1), False, True, 5),
])
def test_avg_pool3d_and_backward(args):
    check_lowering(aten.avg_pool3d.default, x, *args)
    out = aten.avg_pool3d(x, *args)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    check_lowering(aten.avg_pool3d_backward.default, grad, x, *args)


def test_avg_pool3d_of_integers_truncates():
    ints = torch.randint(-20, 20, (1, 2, 4, 4, 4), generator=g)
    check_lowering(aten.avg_pool3d.default, ints, (3, 3, 3), (1, 1, 1))


@pytest.mark.parametrize("size", [(2, 3, 4), (5, 6, 7), (3, 4, 5)])
def test_adaptive_avg_pool3d_and_backward(size):
    check_lowering(aten._adaptive_avg_pool3d.default, x, size)
    grad = torch.randn(2, 3, *size, generator=g, dtype=torch.float64)
    check_lowering(aten._adaptive_avg_pool3d_backward.default, grad, x)


@pytest.mark.parametrize("size", [(2, 3, 4), (3, 4, 5)])
def test_adaptive_max_pool3d_and_backward(size):
    check_lowering(aten.adaptive_max_pool3d.default, x, size)
    _, indices = aten.adaptive_max_pool3d(x, size)
    grad = torch.randn(indices.shape, generator=g, dtype=torch.float64)
    check_lowering(aten.adaptive_max_pool3d_backward.default, grad, x, indices)


def test_max_pool3d_backward_scatters_into_the_saved_indices():
    args = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), False)
    out, indices = aten.max_pool3d_with_indices(x, *args)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    check_lowering(aten.max_pool3d_with_indices_backward.default, grad, x, *args, indices)


@pytest.mark.parametrize("args", [
    ((2, 2, 2), (), (0, 0, 0), (1, 1, 1), False),
    ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), True),
    ((2, 3, 2), (1, 2, 3), (0, 1, 1), (2, 1, 2), False),
])
def test_max_pool3d_with_indices_gives_values_and_first_maximum_indices(args):
    # Lowered directly (PyTorch 2.11 sends the op itself; 2.13 decomposes it first).
    check_lowering(aten.max_pool3d_with_indices.default, x, *args)
