"""Hurwitz zeta and polygamma on the spmd device against CPU PyTorch.

Negative arguments are the point: there the series must be summed past the poles
(``jax.scipy.special`` is inaccurate), and PyTorch's pole / domain rules must hold.
"""

import pytest
import torch

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-9)}
SPECIAL_X = [0.0, -0.0, -2.0, -1.0, 1.0, 0.5, 1e-5, -8.4784, 100.0, 1e4, float("inf"),
             -float("inf"), float("nan")]


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_polygamma_matches_cpu_for_negative_and_positive_arguments(n, dtype):
    x = torch.cat([torch.linspace(-12.3, 12.3, 301, dtype=dtype), torch.tensor(SPECIAL_X, dtype=dtype)])
    close(torch.polygamma(n, x.to("spmd")), torch.polygamma(n, x), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_zeta_follows_pytorchs_poles_and_domain(dtype):
    # q = 0, -3 are poles (inf even for x = nan); non-integer x with q < 0 is nan; x < 1 nan.
    x = torch.tensor([1.0, 1.5, 2.0, 3.0, 0.5, 7.0, float("inf"), 1.0001, 30.0, float("nan")],
                     dtype=dtype)[:, None]
    q = torch.tensor([-3.5, -3.0, -0.5, 0.0, 0.5, 1.0, 2.5, 20.0, 1e-3, float("nan"),
                      float("inf"), -float("inf")], dtype=dtype)
    close(torch.special.zeta(x.to("spmd"), q.to("spmd")), torch.special.zeta(x, q), dtype)


def test_zeta_with_python_scalar_arguments():
    q = torch.linspace(-4.75, 6.25, 12)
    close(torch.special.zeta(3.0, q.to("spmd")), torch.special.zeta(3.0, q), torch.float32)
    x = torch.linspace(1.5, 9.5, 5)
    close(torch.special.zeta(x.to("spmd"), 2.5), torch.special.zeta(x, 2.5), torch.float32)
