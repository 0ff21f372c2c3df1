"""histc and histogram(bins=int) against CPU PyTorch."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
x = torch.randn(50, generator=g, dtype=torch.float64)
x[:3] = torch.tensor([float("nan"), 5.0, -5.0])  # a NaN and values outside (-2, 2)
grid = torch.arange(11, dtype=torch.float64) / 10  # values on the bin edges


@pytest.mark.parametrize("bins,low,high", [(10, -2, 2), (3, 0, 1)])
def test_histc_skips_nans_and_values_outside(bins, low, high):
    check_lowering(aten.histc.default, x, bins, low, high)


@pytest.mark.parametrize("bins,low,high", [(10, -2, 2), (7, 0, 0), (3, 0, 1)])
def test_histc_of_values_on_bin_edges(bins, low, high):
    check_lowering(aten.histc.default, grid, bins, low, high)


def test_histc_of_equal_values_widens_the_range():
    check_lowering(aten.histc.default, torch.full((4,), 2.0), 4)
