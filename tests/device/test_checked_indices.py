"""Out-of-range indices (docs/concepts/rules.md): XLA clamps or drops them; checked mode raises as CPU.

``torchspmd.debug.check_indices(True)`` (or ``TORCHSPMD_CHECK_INDICES=1``) makes each
indexing op raise CPU PyTorch's exception for the first index out of range.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEV = torchspmd.device()


@pytest.fixture
def checked():
    torchspmd.debug.check_indices(True)
    yield
    torchspmd.debug.check_indices(False)


def _on(device):
    """``torch.tensor`` on ``device``: makes the indices (and values) of a case."""
    return lambda values: torch.tensor(values).to(device)


CASES = {  # case -> fn(x, t): the op on x, with t making tensors on x's device
    "getitem": lambda x, t: x[t([0, 5])],
    "getitem_negative": lambda x, t: x[:, t([-5])],
    "gather": lambda x, t: x.gather(1, t([[0], [4], [1]])),
    "index_select": lambda x, t: x.index_select(0, t([3])),
    "index_put_": lambda x, t: x.index_put_((t([7]),), t(1.0)),
    "setitem": lambda x, t: x.__setitem__(t([7]), 1.0),
    "embedding": lambda x, t: F.embedding(t([5]), x),
    "take": lambda x, t: x.take(t([100])),
    "scatter_": lambda x, t: x.scatter_(0, t([[9, 0, 0, 0]]), 1.0),
    "index_add_": lambda x, t: x.index_add_(0, t([9]), t([[1.0, 1.0, 1.0, 1.0]])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checked_mode_raises_what_cpu_raises(checked, case):
    with pytest.raises(Exception) as on_cpu:
        CASES[case](torch.arange(12.).reshape(3, 4), _on("cpu"))
    with pytest.raises(type(on_cpu.value)) as on_device:
        CASES[case](torch.arange(12.).reshape(3, 4).to(DEV), _on(DEV))
    if case != "getitem_negative":  # CPU names the index tensor's dim there, we the indexed dim
        assert str(on_device.value) == str(on_cpu.value)


def test_checked_mode_reads_indices_computed_on_the_device(checked):
    x = torch.arange(12.).reshape(3, 4).to(DEV)
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 3"):
        x[_on(DEV)([1]) * 4]


def test_checked_mode_lets_indices_in_range_through(checked):
    x = torch.arange(12.).reshape(3, 4).to(DEV)
    assert x[_on(DEV)([-1, 0])].cpu().tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]


def test_unchecked_reads_clamp_and_writes_drop():
    x = torch.arange(6.).to(DEV)
    assert x[_on(DEV)([1, 9])].cpu().tolist() == [1.0, 5.0]
    x[_on(DEV)([9])] = -1.0
    assert x.cpu().tolist() == [0, 1, 2, 3, 4, 5]
