"""Fractional max pooling with given random samples, and its backward, against CPU."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("kernel,out", [((2, 3), (4, 3)), ((3, 3), (2, 5)), ((2, 2), (1, 6))])
def test_fractional_max_pool2d(kernel, out):
    x = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    samples = torch.rand(2, 3, 2, generator=g, dtype=torch.float64)
    check_lowering(aten.fractional_max_pool2d.default, x, kernel, out, samples)
    values, indices = aten.fractional_max_pool2d(x, kernel, out, samples)
    grad = torch.randn(values.shape, generator=g, dtype=torch.float64)
    check_lowering(aten.fractional_max_pool2d_backward.default, grad, x, kernel, out, indices)


def test_fractional_max_pool3d_unbatched():
    x = torch.randn(2, 7, 6, 8, generator=g, dtype=torch.float64)
    samples = torch.rand(1, 2, 3, generator=g, dtype=torch.float64)
    check_lowering(aten.fractional_max_pool3d.default, x, (2, 3, 2), (3, 2, 4), samples)
    values, indices = aten.fractional_max_pool3d(x, (2, 3, 2), (3, 2, 4), samples)
    grad = torch.randn(values.shape, generator=g, dtype=torch.float64)
    check_lowering(aten.fractional_max_pool3d_backward.default, grad, x, (2, 3, 2), (3, 2, 4), indices)


def test_fractional_max_pool_with_float32_samples():
    x = torch.randn(1, 2, 10, 10, generator=g)
    check_lowering(aten.fractional_max_pool2d.default, x, (3, 3), (4, 4), torch.rand(1, 2, 2, generator=g))
