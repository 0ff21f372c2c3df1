"""Ops whose output shape depends on the data: one host read of a size, results on CPU's.

Each op reads one small value to the host (the size), then continues with static shapes
on the device; inside a compiled step (``torchspmd.compile``) they raise an error naming
the op.
"""

import pytest
import torch

import torchspmd
from torchspmd.step import HostReadInStep
from torchspmd.runtime.metrics import COUNTERS

x_cpu = torch.tensor([[0.0, 1.5, -2.0, 0.0], [3.0, 0.0, 3.0, 1.5], [-2.0, 0.0, 0.0, 7.0]])
i_cpu = torch.tensor([4, 1, 1, 0, 4, 4, 2, 2, 2, 1])


def _same(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _same(a, e)
        return
    assert actual.device.type == "spmd"
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_nonzero_matches_cpu():
    _same(torch.nonzero(x_cpu.to("spmd")), torch.nonzero(x_cpu))
    _same(torch.nonzero(x_cpu.to("spmd"), as_tuple=True), torch.nonzero(x_cpu, as_tuple=True))


def test_nonzero_reads_only_its_count_to_the_host():
    x = x_cpu.to("spmd") * 2
    torchspmd.sync()
    before = COUNTERS["bytes_to_host"]
    out = torch.nonzero(x)
    assert COUNTERS["bytes_to_host"] - before == 8  # one int64: the count
    assert out.shape == (7, 2)


def test_argwhere_matches_cpu():
    _same(torch.argwhere(x_cpu.to("spmd") > 1), torch.argwhere(x_cpu > 1))


def test_nonzero_static_pads_with_fill_value():
    x = x_cpu.to("spmd")
    _same(torch.nonzero_static(x, size=9, fill_value=-7), torch.nonzero_static(x_cpu, size=9, fill_value=-7))
    _same(torch.nonzero_static(x, size=2), torch.nonzero_static(x_cpu, size=2))


def test_boolean_mask_indexing_matches_cpu():
    x = x_cpu.to("spmd")
    _same(x[x > 0], x_cpu[x_cpu > 0])
    _same(x[:, torch.tensor([True, False, True, True]).to("spmd")],
          x_cpu[:, torch.tensor([True, False, True, True])])


def test_boolean_row_mask_keeps_the_other_dims():
    rows = torch.tensor([True, False, True])
    _same(x_cpu.to("spmd")[rows.to("spmd")], x_cpu[rows])


def test_mask_of_the_wrong_shape_raises_index_error():
    with pytest.raises(IndexError, match="shape of the mask"):
        x_cpu.to("spmd")[torch.tensor([True, False]).to("spmd")]


def test_boolean_mask_assignment_stays_static():
    x, expected = x_cpu.to("spmd"), x_cpu.clone()
    torchspmd.sync()
    before = COUNTERS["bytes_to_host"]
    x[x > 1] = -1.0
    expected[expected > 1] = -1.0
    assert COUNTERS["bytes_to_host"] == before  # no host read
    _same(x, expected)


def test_masked_select_broadcasts_like_cpu():
    mask = torch.tensor([True, False, False, True])
    _same(torch.masked_select(x_cpu.to("spmd"), mask.to("spmd")), torch.masked_select(x_cpu, mask))


def test_unique_with_inverse_and_counts_matches_cpu():
    got = torch.unique(i_cpu.to("spmd"), return_inverse=True, return_counts=True)
    _same(got, torch.unique(i_cpu, return_inverse=True, return_counts=True))


def test_unique_of_floats_keeps_nans_distinct():
    x = torch.tensor([1.0, float("nan"), 0.5, float("nan"), 1.0])
    _same(torch.unique(x.to("spmd"), return_counts=True), torch.unique(x, return_counts=True))


def test_unique_along_a_dim_matches_cpu():
    x = torch.tensor([[1, 2, 1], [0, 1, 0], [1, 2, 1], [0, 0, 5]])
    for dim in (0, 1):
        got = torch.unique(x.to("spmd"), dim=dim, return_inverse=True, return_counts=True)
        _same(got, torch.unique(x, dim=dim, return_inverse=True, return_counts=True))


def test_unique_consecutive_matches_cpu():
    got = torch.unique_consecutive(i_cpu.to("spmd"), return_inverse=True, return_counts=True)
    _same(got, torch.unique_consecutive(i_cpu, return_inverse=True, return_counts=True))


def test_unique_consecutive_along_a_dim_matches_cpu():
    x = torch.tensor([[1, 1, 2, 2, 1], [0, 0, 3, 3, 0]])
    got = torch.unique_consecutive(x.to("spmd"), dim=1, return_counts=True)
    _same(got, torch.unique_consecutive(x, dim=1, return_counts=True))


def test_bincount_with_and_without_weights_matches_cpu():
    w = torch.linspace(0, 1, 10)
    _same(torch.bincount(i_cpu.to("spmd")), torch.bincount(i_cpu))
    _same(torch.bincount(i_cpu.to("spmd"), w.to("spmd"), minlength=8),
          torch.bincount(i_cpu, w, minlength=8))


def test_bincount_of_negative_values_raises_like_cpu():
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1]).to("spmd"))


def test_repeat_interleave_with_tensor_repeats_matches_cpu():
    repeats = torch.tensor([2, 0, 1])
    _same(torch.repeat_interleave(x_cpu.to("spmd"), repeats.to("spmd"), dim=0),
          torch.repeat_interleave(x_cpu, repeats, dim=0))
    _same(torch.repeat_interleave(repeats.to("spmd")), torch.repeat_interleave(repeats))


@pytest.mark.parametrize("op, name", [(lambda x: x[x > 0], "torch.nonzero"),
                                      (torch.unique, "torch.unique")])
def test_data_dependent_ops_refuse_inside_a_compiled_step_naming_the_op(op, name):
    step = torchspmd.compile(lambda x: op(x * 2))
    with pytest.raises(HostReadInStep, match=f"{name} .*to decide its output shape.*compiled"):
        step(x_cpu.to("spmd"))
