"""``torch.special`` functions on the spmd device against CPU PyTorch, edges included.

One program per dtype computes every function, so the sweep costs one compile.
"""

import pytest
import torch

S = torch.special
UNARY = {"i0": S.i0, "i0e": S.i0e, "i1": S.i1, "i1e": S.i1e, "ndtr": S.ndtr,
         "log_ndtr": S.log_ndtr, "erfcx": S.erfcx, "digamma": S.digamma, "gammaln": S.gammaln,
         "entr": S.entr, "sinc": S.sinc, "expit": S.expit, "erf": S.erf, "erfc": S.erfc,
         "exp2": S.exp2, "expm1": S.expm1, "log1p": S.log1p, "psi": S.psi}
IN_UNIT_INTERVAL = {"ndtri": S.ndtri, "logit": S.logit, "erfinv": S.erfinv}
EDGES = [0.0, -0.0, 1e-30, -1e-30, 0.5, 1.0, -1.0, 2.0, -2.0, 9.2, 9.25, 9.4, 1e10, -1e10,
         float("inf"), -float("inf"), float("nan")]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-9, atol=1e-12)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_unary_special_functions_match_cpu_over_a_wide_range(dtype):
    x = torch.cat([torch.linspace(-30, 30, 241, dtype=dtype), torch.tensor(EDGES, dtype=dtype)])
    p = torch.cat([torch.linspace(0.01, 0.99, 50, dtype=dtype), torch.tensor([0.0, 1.0, 0.5])])
    p = p.to(dtype)
    xs, ps = x.to("spmd"), p.to("spmd")
    actual = {name: fn(xs) for name, fn in UNARY.items()}
    actual.update({name: fn(ps) for name, fn in IN_UNIT_INTERVAL.items()})
    expected = {name: fn(x) for name, fn in UNARY.items()}
    expected.update({name: fn(p) for name, fn in IN_UNIT_INTERVAL.items()})
    for name in actual:
        torch.testing.assert_close(actual[name].cpu(), expected[name], equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}", **TOL[dtype])


def test_erfcx_has_no_float32_underflow_hole_near_9():
    # exp(x^2) * erfc(x) loses erfc(x) to flushed subnormals for 9.2 <= x <= 9.4.
    x = torch.linspace(8.5, 10.0, 61)
    torch.testing.assert_close(S.erfcx(x.to("spmd")).cpu(), S.erfcx(x), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fn", [S.gammainc, S.gammaincc], ids=["gammainc", "gammaincc"])
def test_incomplete_gamma_follows_pytorchs_boundary_values(fn):
    inf, nan = float("inf"), float("nan")
    a = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, inf, inf, 2.0, -1.0, 1.0, nan, 2.0, 0.5, 3.0],
                     dtype=torch.float64)
    x = torch.tensor([1.0, 0.0, -1.0, 0.0, inf, 1.0, inf, -1.0, 1.0, nan, 1.0, 1e300, 0.3, 2.5],
                     dtype=torch.float64)
    torch.testing.assert_close(fn(a.to("spmd"), x.to("spmd")).cpu(), fn(a, x), equal_nan=True,
                               rtol=1e-9, atol=1e-12)
