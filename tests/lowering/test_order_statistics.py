"""median, nanmedian and mode lowerings against CPU PyTorch (values and indices)."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
nan = float("nan")
distinct = torch.tensor([[3.0, -1.0, 2.5, 0.5], [7.0, 4.0, -6.0, 1.0], [0.0, 9.0, 8.0, -2.0]])
with_nan = torch.tensor([[1.0, nan, 2.0, nan, 0.0], [4.0, 3.0, 5.0, 1.0, 2.0], [nan, nan, nan, nan, nan]])
ties = torch.tensor([[2, 1, 2, 1, 3, 3, 0], [5, 5, 5, 4, 4, 4, 1], [7, 7, 7, 7, 7, 7, 7]])


@pytest.mark.parametrize("op", [aten.median.default, aten.nanmedian.default])
def test_median_of_all_elements(op):
    check_lowering(op, distinct)
    check_lowering(op, with_nan)


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_median_along_a_dim_gives_the_lower_middle_and_its_index(dim, keepdim):
    check_lowering(aten.median.dim, distinct, dim, keepdim)


def test_median_of_a_slice_with_nan_is_nan_at_the_first_nan():
    check_lowering(aten.median.dim, with_nan, 1)


def test_nanmedian_skips_nans():
    # An all-NaN slice's index is wherever CPU's nth_element leaves a NaN: not compared.
    check_lowering(aten.nanmedian.dim, with_nan[:2], 1, True)


def test_mode_picks_the_smallest_most_frequent_value_at_its_last_index():
    check_lowering(aten.mode.default, ties, 1)
    check_lowering(aten.mode.default, ties.float(), 0, True)


def test_mode_of_a_scalar():
    check_lowering(aten.mode.default, torch.tensor(4.0))
