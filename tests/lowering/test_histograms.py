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


@pytest.mark.parametrize("density", [False, True])
def test_histogram_with_range_and_weights(density):
    w = torch.rand(50, generator=g, dtype=torch.float64)
    check_lowering(aten.histogram.bin_ct, x, 6, range=[-1.0, 2.0], weight=w, density=density)


def test_histogram_over_the_data_range():
    check_lowering(aten.histogram.bin_ct, grid, 4)


def test_histogram_of_equal_values_widens_by_half():
    check_lowering(aten.histogram.bin_ct, torch.full((3,), 2.0), 4)


@pytest.mark.parametrize("density", [False, True])
def test_histogram_over_given_edges(density):
    edges = torch.tensor([-1.0, 0.0, 0.5, 0.8, 2.0], dtype=torch.float64)
    check_lowering(aten.histogram.bins_tensor, torch.cat([x, grid]), edges, density=density)
