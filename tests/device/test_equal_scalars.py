"""Equal Python numbers in one graph are one program input.

Python numbers are graph inputs (a new value never recompiles), and equal ones (same type,
same value; ``-0.0`` is not ``0.0``) share one: the same op in every layer of a model (a
norm's ``eps``, attention's scale) then reads the same input, and XLA compiles the fused
kernel once for all layers instead of once per layer. Which numbers are equal is part of
the graph's key: when a value later differs from the one it equalled, the graph compiles
once more and computes the new values, never the old ones. A random op's seed never
shares: each draw stays its own.
"""

import re

import torch

import torchspmd
from torchspmd.runtime.metrics import COUNTERS


def _float_inputs() -> int:
    """Length of the latest program's vector of float inputs (its ``f64[N]`` parameter)."""
    found = re.findall(r"f64\[(\d+)\]\{0\} parameter", torchspmd.debug.last_hlo())
    return int(found[0]) if found else 0


def _layers(x: torch.Tensor, eps: list[float], scale: list[float]) -> torch.Tensor:
    for e, s in zip(eps, scale):
        x = torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=e) * s
    return x


def test_the_same_number_in_every_layer_is_one_input():
    x = torch.randn(4, 16)
    out = _layers(x.to("spmd"), [1e-6] * 8, [0.5] * 8)
    torch.testing.assert_close(out.cpu(), _layers(x, [1e-6] * 8, [0.5] * 8))
    assert _float_inputs() == 2


def test_numbers_that_stop_being_equal_compile_once_more_and_compute_the_new_values():
    x = torch.randn(4, 16)
    _layers(x.to("spmd"), [1e-6] * 3, [0.5] * 3).cpu()
    before = COUNTERS["graphs_compiled"]
    scales = [0.5, 0.25, 2.0]
    out = _layers(x.to("spmd"), [1e-6] * 3, scales)
    torch.testing.assert_close(out.cpu(), _layers(x, [1e-6] * 3, scales))
    assert COUNTERS["graphs_compiled"] == before + 1


def test_different_values_keep_the_same_pattern_without_compiling():
    x = torch.randn(4, 16)
    _layers(x.to("spmd"), [1e-6] * 3, [0.5] * 3).cpu()
    before = COUNTERS["graphs_compiled"]
    out = _layers(x.to("spmd"), [1e-5] * 3, [3.0] * 3)
    torch.testing.assert_close(out.cpu(), _layers(x, [1e-5] * 3, [3.0] * 3))
    assert COUNTERS["graphs_compiled"] == before


def test_minus_zero_is_not_zero():
    x = torch.ones(3)
    a, b = x.to("spmd") * 0.0, x.to("spmd") * -0.0
    assert not torch.signbit(a.cpu()).any()
    assert torch.signbit(b.cpu()).all()


def test_an_int_and_a_float_of_the_same_value_stay_apart():
    x = torch.arange(6)
    on_device = x.to("spmd")
    out = (on_device + 2, on_device.float() * 2.0, on_device < 2)
    expected = (x + 2, x.float() * 2.0, x < 2)
    for got, want in zip(out, expected):
        assert torch.equal(got.cpu(), want)


def test_random_ops_keep_their_own_seeds():
    torch.manual_seed(0)
    a = torch.rand(64, device="spmd")
    b = torch.rand(64, device="spmd")
    dropped = torch.nn.functional.dropout(torch.ones(64, device="spmd"), 0.5)
    dropped_again = torch.nn.functional.dropout(torch.ones(64, device="spmd"), 0.5)
    torchspmd.sync()
    assert not torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(dropped.cpu(), dropped_again.cpu())
