"""Lowerings of ops whose output size is a static argument, against CPU PyTorch."""

import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
x = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, -3.0]])


def test_nonzero_static_fills_missing_rows():
    check_lowering(aten.nonzero_static.default, x, size=5, fill_value=-2)


def test_nonzero_static_truncates_to_size():
    check_lowering(aten.nonzero_static.default, x, size=2)


def test_nonzero_static_of_a_scalar_has_no_coordinates():
    check_lowering(aten.nonzero_static.default, torch.tensor(3.0), size=2)
