"""LDL^T (Bunch-Kaufman) lowerings against CPU PyTorch, LAPACK's packed format included."""

import pytest
import torch

from tests.lowering.test_linalg import check_lowering, run_lowering

aten = torch.ops.aten
F64 = {"atol": 1e-10, "rtol": 1e-10}
g = torch.Generator().manual_seed(0)


def symmetric(*shape):
    a = torch.randn(*shape, generator=g, dtype=torch.float64)
    return a + a.mT


def zero_diagonal(n):
    """Indefinite with a zero diagonal: Bunch-Kaufman must take 2x2 pivots."""
    a = symmetric(n, n)
    return a - torch.diag_embed(a.diagonal())


@pytest.mark.parametrize("make", [lambda: symmetric(6, 6), lambda: symmetric(3, 5, 5),
                                  lambda: zero_diagonal(7), lambda: symmetric(2, 0, 0)],
                         ids=["one", "batch", "two_by_two_pivots", "empty"])
def test_factor_matches_cpu(make):
    check_lowering(aten.linalg_ldl_factor_ex.default, make(), **F64)


def test_factor_takes_two_by_two_pivots_as_lapack_does():
    a = zero_diagonal(6)
    pivots = run_lowering(aten.linalg_ldl_factor_ex.default, a)[1]
    assert (pivots < 0).any()
    assert torch.equal(pivots, torch.linalg.ldl_factor_ex(a).pivots)


def test_singular_matrix_reports_info():
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[0, 0] = 2.0
    expected = torch.linalg.ldl_factor_ex(a)
    assert expected.info.item() > 0
    assert run_lowering(aten.linalg_ldl_factor_ex.default, a)[2].item() == expected.info.item()


@pytest.mark.parametrize("make", [lambda: symmetric(6, 6), lambda: zero_diagonal(7)],
                         ids=["one_by_one", "two_by_two"])
def test_solve_matches_cpu(make):
    a = make()
    LD, pivots = torch.linalg.ldl_factor(a)
    b = torch.randn(2, a.shape[-1], 3, generator=g, dtype=torch.float64)
    check_lowering(aten.linalg_ldl_solve.default, LD, pivots, b, atol=1e-9, rtol=1e-9)


def test_complex_input_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="linalg.ldl_factor of complex"):
        run_lowering(aten.linalg_ldl_factor_ex.default, symmetric(3, 3).to(torch.complex128))
