"""One computation compiled for many shapes warns once, naming the op whose shape changed
(``runtime/shape_changes.py``); fixed shapes and different computations never warn."""

import warnings

import pytest
import torch

import torchspmd
from torchspmd.runtime import shape_changes
from torchspmd.runtime.shape_changes import MIN_OPS, WARN_AFTER, ShapeRecompileWarning

DEV = torchspmd.device()


def _grow(steps: int, start: int = 3) -> torch.Tensor:
    """A loop whose tensor grows by a column each iteration, read every time, from
    ``start`` columns (each test its own widths: each shape compiles anew)."""
    x = torch.ones(2, start).to(DEV)
    for _ in range(steps):
        y = x
        for _ in range(MIN_OPS // 2):  # a computation large enough to be warned about
            y = (y * 0.5).tanh()
        x = torch.cat([x, y.sum(1, keepdim=True)], 1)
        x.sum().item()
    return x


def test_a_loop_whose_shapes_change_every_iteration_warns_once_naming_the_shapes():
    before = torchspmd.metrics()["shape_recompiles"]
    with pytest.warns(ShapeRecompileWarning, match=r"compiled \d+ programs, one per new shape "
                                                     r"\(aten\.\w+\.\w+'s output \(2, \d+\) -> \(2, \d+\)\)"):
        x = _grow(WARN_AFTER + 3, start=101)
    assert torchspmd.metrics()["shape_recompiles"] - before >= WARN_AFTER - 1
    torch.testing.assert_close(x.cpu()[:, :101], torch.ones(2, 101))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeRecompileWarning)
        _grow(3, start=101 + WARN_AFTER + 3)  # the same computation: warned once already


def test_a_small_computation_on_many_shapes_never_warns():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeRecompileWarning)
        for n in range(1, 2 * WARN_AFTER):
            (torch.ones(n).to(DEV) * 2).sum().item()


def test_a_loop_of_fixed_shapes_never_warns():
    w = torch.randn(4, 4).to(DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeRecompileWarning)
        for _ in range(3 * WARN_AFTER):
            w = (w @ w).tanh()
            w.sum().item()


def test_recompiles_inside_watched_are_counted_not_warned():
    before = torchspmd.metrics()["shape_recompiles"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeRecompileWarning)
        with shape_changes.watched():
            _grow(WARN_AFTER + 2, start=201)
    assert torchspmd.metrics()["shape_recompiles"] - before >= WARN_AFTER
