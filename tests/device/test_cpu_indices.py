"""An spmd tensor indexed by CPU tensors, as a CUDA tensor may be: ``x[i]``, ``x[mask]``,
``x[i] = v`` and ``x[mask] = v`` with ``i``/``mask`` on the CPU take them to the devices
with the op (a CPU mask's true elements are found on the host, with no device read).
Ops whose index is an ordinary operand (``index_select``, ``gather``, ``masked_fill``)
still need it on the device, as on CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, mark_sharding

DEV = torchspmd.device()
X = torch.arange(24.0).reshape(6, 4)


def _on_device(sharded: bool) -> torch.Tensor:
    x = X.to(DEV)
    if sharded:
        mark_sharding(x, Mesh(np.arange(8), (4, 2), ("data", "model")), (None, "model"))
    return x


@pytest.mark.parametrize("sharded", [False, True])
def test_reading_through_cpu_indices_and_masks_matches_cpu(sharded):
    x = _on_device(sharded)
    rows, mask = torch.tensor([4, 0, 4]), X > 9
    torch.testing.assert_close(x[rows].cpu(), X[rows], rtol=0, atol=0)
    torch.testing.assert_close(x[mask].cpu(), X[mask], rtol=0, atol=0)
    torch.testing.assert_close(x[:, torch.tensor([3, 1])].cpu(), X[:, [3, 1]], rtol=0, atol=0)
    torch.testing.assert_close(x[mask[:, 0]].cpu(), X[mask[:, 0]], rtol=0, atol=0)


@pytest.mark.parametrize("sharded", [False, True])
def test_writing_through_cpu_indices_and_masks_matches_cpu(sharded):
    x, expected = _on_device(sharded), X.clone()
    for t in (x, expected):
        t[torch.tensor([1, 3])] = -1.0
        t[X > 20] = 0.0
        t.index_put_((torch.tensor([5]), torch.tensor([2])), torch.tensor(7.0), accumulate=True)
    torch.testing.assert_close(x.cpu(), expected, rtol=0, atol=0)


def test_an_ordinary_operand_on_the_cpu_is_still_refused():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        X.to(DEV).index_select(1, torch.tensor([0, 1]))
