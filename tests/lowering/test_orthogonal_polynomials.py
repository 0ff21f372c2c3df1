"""Orthogonal polynomials (``torch.special.*_polynomial_*``) on the spmd device against CPU.

A grid of points (interval ends, inside, outside, inf) times degrees (negative, 0, 1, the
recurrence, the trigonometric form of high-degree Chebyshev polynomials, fractional and
non-finite degrees, and Hermite degrees past PyTorch's nan limit).
"""

import pytest
import torch

NAMES = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]
# No nan points: PyTorch's U/V/W kernels return an uninitialized value for nan x.
POINTS = [-3.0, -1.5, -1.0, -0.999, -0.5, -1e-9, 0.0, 1e-9, 0.25, 0.5, 0.75, 0.999, 1.0, 1.5,
          3.0, float("inf")]
DEGREES = [-3.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 13.0, 25.0, 2.7,
           -0.5, float("nan"), float("inf"), 129.0, 513.0]


def close(actual, expected, dtype=torch.float64):
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tol)


@pytest.mark.parametrize("name", NAMES)
def test_matches_cpu_on_a_grid_of_points_and_degrees(name):
    fn = getattr(torch.special, name)
    x = torch.tensor(POINTS, dtype=torch.float64)[:, None]
    n = torch.tensor(DEGREES, dtype=torch.float64)
    close(fn(x.to("spmd"), n.to("spmd")), fn(x, n))


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "hermite_polynomial_h",
                                  "shifted_chebyshev_polynomial_w"])
def test_integer_degree_tensor_and_python_scalars(name):
    fn = getattr(torch.special, name)
    x = torch.linspace(-2, 2, 9)
    n = torch.arange(-1, 12)
    close(fn(x.to("spmd"), 7), fn(x, 7), torch.float32)                       # n_scalar
    close(fn(0.3, n.to("spmd")), fn(0.3, n), torch.float32)                   # x_scalar
    close(fn(x[:, None].to("spmd"), n.to("spmd")), fn(x[:, None], n), torch.float32)


def test_a_huge_degree_outside_the_interval_stops_once_values_overflow():
    x = torch.tensor([3.0, -2.5])
    n = torch.tensor([10**7])
    close(torch.special.chebyshev_polynomial_t(x.to("spmd"), n.to("spmd")),
          torch.special.chebyshev_polynomial_t(x, n), torch.float32)
