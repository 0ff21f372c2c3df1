"""Bessel and Airy functions (``torch.special``) on the spmd device against CPU PyTorch.

Inputs cover every interval of the piecewise approximations, their boundaries, the
poles and domain edges (0, negative numbers), and inf / nan.
"""

import pytest
import torch

FUNCTIONS = ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
             "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
             "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
             "airy_ai"]
EDGES = [0.0, -0.0, 1e-6, -1e-6, 1e-30, 0.4999, 0.5, 2.0, 2.09, -2.09, 2.0899999, 5.0, -5.0,
         8.0, 8.3203353, 103.9, 1e4, float("inf"), -float("inf"), float("nan")]
# float32 rounding of large arguments of sin/cos differs between XLA and libm (Airy Ai at
# x = -100 has a phase of 667 radians): the float32 tolerance allows for it.
TOL = {torch.float32: dict(rtol=1e-5, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


def inputs(dtype):
    return torch.cat([torch.linspace(-40, 40, 801, dtype=dtype), torch.tensor(EDGES, dtype=dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_matches_cpu_over_every_interval_and_edge(name, dtype):
    fn = getattr(torch.special, name)
    x = inputs(dtype)
    torch.testing.assert_close(fn(x.to("spmd")).cpu(), fn(x), equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("name", ["bessel_j0", "modified_bessel_k1", "airy_ai"])
def test_integer_input_gives_the_default_float_result(name):
    fn = getattr(torch.special, name)
    n = torch.arange(-6, 7)
    actual = fn(n.to("spmd"))
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), fn(n), equal_nan=True, **TOL[torch.float32])
