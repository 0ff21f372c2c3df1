"""segment_reduce and its backward against CPU PyTorch."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
data = torch.randn(7, 3, generator=g, dtype=torch.float64)
data[5, 1] = data[6, 1]  # a tie for max/min
lengths = torch.tensor([2, 0, 3, 2])
offsets = torch.tensor([0, 2, 2, 5, 7])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 0.5])
def test_segment_reduce_by_lengths(reduce, initial):
    check_lowering(aten.segment_reduce.default, data, reduce, lengths=lengths, initial=initial)


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_segment_reduce_by_offsets(reduce):
    check_lowering(aten.segment_reduce.default, data, reduce, offsets=offsets)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_segment_reduce_backward(reduce):
    out = aten.segment_reduce(data, reduce, lengths=lengths, initial=0.0)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    check_lowering(aten._segment_reduce_backward.default, grad, out, data, reduce,
                   lengths=lengths, initial=0.0)
