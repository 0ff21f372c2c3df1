"""Matrix factorization and solver lowerings against CPU PyTorch.

Values that are unique (LU, Cholesky, triangular solves, eigen- and singular values) are
compared directly; eigen- and singular vectors, which are unique only up to sign/phase,
are compared through what they reconstruct.
"""

import pytest
import torch

from tests.lowering.test_linalg import check_lowering, run_lowering

aten = torch.ops.aten
F64 = {"atol": 1e-10, "rtol": 1e-10}
g = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=g, dtype=dtype)


def spd(*shape):
    """A batch of well-conditioned symmetric positive-definite matrices."""
    a = r(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=a.dtype)


def tri(*shape, upper=False):
    a = r(*shape) + 3 * torch.eye(shape[-1], dtype=torch.float64)
    return a.triu() if upper else a.tril()


def pivots_of(a):
    return torch.linalg.lu_factor(a)


CASES = {
    "cholesky_lower": (aten.linalg_cholesky_ex.default, lambda: (spd(2, 4, 4),), {}),
    "cholesky_upper": (aten.linalg_cholesky_ex.default, lambda: (spd(4, 4),), {"upper": True}),
    "lu_factor_square": (aten.linalg_lu_factor_ex.default, lambda: (r(3, 4, 4),), {}),
    "lu_factor_wide": (aten.linalg_lu_factor_ex.default, lambda: (r(3, 5),), {}),
    "lu_factor_tall": (aten.linalg_lu_factor_ex.default, lambda: (r(2, 5, 3),), {}),
    "lu": (aten.linalg_lu.default, lambda: (r(2, 5, 3),), {}),
    "lu_unpack": (aten.lu_unpack.default, lambda: pivots_of(r(2, 4, 4)), {}),
    "lu_solve": (aten.linalg_lu_solve.default, lambda: (*pivots_of(r(4, 4)), r(2, 4, 3)), {}),
    "lu_solve_adjoint": (aten.linalg_lu_solve.default, lambda: (*pivots_of(r(2, 4, 4)), r(4, 3)),
                         {"adjoint": True}),
    "lu_solve_right": (aten.linalg_lu_solve.default, lambda: (*pivots_of(r(4, 4)), r(3, 4)),
                       {"left": False}),
    "lu_solve_right_adjoint": (aten.linalg_lu_solve.default,
                               lambda: (*pivots_of(r(4, 4)), r(3, 4)), {"left": False, "adjoint": True}),
    "solve_triangular_upper": (aten.linalg_solve_triangular.default,
                               lambda: (tri(4, 4, upper=True), r(2, 4, 3)), {"upper": True}),
    "solve_triangular_right_unit": (aten.linalg_solve_triangular.default,
                                    lambda: (tri(2, 4, 4), r(3, 4)),
                                    {"upper": False, "left": False, "unitriangular": True}),
    "triangular_solve_transpose": (aten.triangular_solve.default,
                                   lambda: (r(4, 2), tri(4, 4, upper=True)), {"transpose": True}),
    "inv": (aten.linalg_inv_ex.default, lambda: (r(2, 4, 4),), {}),
    "cholesky_solve": (aten.cholesky_solve.default,
                       lambda: (r(2, 4, 3), torch.linalg.cholesky(spd(4, 4))), {}),
    "cholesky_solve_upper": (aten.cholesky_solve.default,
                             lambda: (r(4, 3), torch.linalg.cholesky(spd(4, 4), upper=True)), {"upper": True}),
    "cholesky_inverse": (aten.cholesky_inverse.default, lambda: (torch.linalg.cholesky(spd(4, 4)),), {}),
    "qr_reduced": (aten.linalg_qr.default, lambda: (r(2, 5, 3),), {}),
    "qr_complete": (aten.linalg_qr.default, lambda: (r(5, 3),), {"mode": "complete"}),
    "qr_r": (aten.linalg_qr.default, lambda: (r(3, 5),), {"mode": "r"}),
    "householder_product": (aten.linalg_householder_product.default, lambda: torch.geqrf(r(5, 3)), {}),
    "ormqr_left_transpose": (aten.ormqr.default, lambda: (*torch.geqrf(r(5, 3)), r(5, 2)),
                             {"transpose": True}),
    "ormqr_right": (aten.ormqr.default, lambda: (*torch.geqrf(r(4, 4)), r(2, 4)), {"left": False}),
    "pinv": (aten.linalg_pinv.atol_rtol_tensor, lambda: (r(2, 3, 5),), {}),
    "pinv_hermitian": (aten.linalg_pinv.atol_rtol_tensor, lambda: (spd(4, 4),), {"hermitian": True}),
    "matrix_exp": (aten.linalg_matrix_exp.default, lambda: (r(2, 4, 4) / 2,), {}),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_cpu(name):
    op, make, kwargs = CASES[name]
    check_lowering(op, *make(), **kwargs, **F64)


def test_pinv_absolute_tolerance_drops_small_singular_values():
    a, atol = r(4, 3), torch.tensor(1.5, dtype=torch.float64)
    out = run_lowering(aten.linalg_pinv.atol_rtol_tensor, a, atol=atol)
    torch.testing.assert_close(out, torch.linalg.pinv(a, atol=atol), **F64)


def test_float32_solve_matches_cpu():
    a, b = r(4, 4, dtype=torch.float32), r(4, 2, dtype=torch.float32)
    check_lowering(aten.linalg_lu_solve.default, *torch.linalg.lu_factor(a), b, atol=1e-5, rtol=1e-5)


def test_cholesky_info_names_the_first_failing_minor():
    a = spd(3, 5, 5)
    a[1, 2, 2] = -100.0  # leading minors of order 1, 2 are fine; order 3 is not
    a[2] = -a[2]  # fails at order 1
    expected = torch.linalg.cholesky_ex(a).info
    assert expected.tolist() == [0, 3, 1]
    assert torch.equal(run_lowering(aten.linalg_cholesky_ex.default, a)[1], expected)


def test_lu_info_names_the_first_zero_pivot():
    a = torch.randint(-3, 4, (2, 4, 4), generator=g).double() + 8 * torch.eye(4)
    a[1, :, 2] = 0  # singular, and exactly so in floating point
    expected = torch.linalg.lu_factor_ex(a).info
    assert expected[0] == 0 and expected[1] > 0
    assert torch.equal(run_lowering(aten.linalg_lu_factor_ex.default, a)[2], expected)


def test_eigh_values_match_and_vectors_diagonalize():
    a = spd(2, 5, 5)
    a.triu_(1).add_(torch.randn(5, 5, generator=g, dtype=torch.float64).tril())  # only L is read
    w, v = run_lowering(aten._linalg_eigh.default, a)
    torch.testing.assert_close(w, torch.linalg.eigvalsh(a), **F64)
    sym = a.tril() + a.tril(-1).mT
    torch.testing.assert_close(v @ torch.diag_embed(w) @ v.mT, sym, **F64)


def test_eig_values_match_and_vectors_are_eigenvectors():
    a = r(5, 5)
    w, v = run_lowering(aten.linalg_eig.default, a)
    expected = torch.linalg.eigvals(a)
    assert w.dtype == torch.complex128
    key = lambda z: z.real * 1e3 + z.imag  # noqa: E731  (sort complex values)
    torch.testing.assert_close(w[key(w).argsort()], expected[key(expected).argsort()], **F64)
    torch.testing.assert_close(a.to(v.dtype) @ v, v * w, **F64)


@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd_values_match_and_vectors_reconstruct(full_matrices):
    a = r(2, 5, 3)
    u, s, vh = run_lowering(aten._linalg_svd.default, a, full_matrices)
    torch.testing.assert_close(s, torch.linalg.svdvals(a), **F64)
    assert u.shape == (2, 5, 5 if full_matrices else 3)
    torch.testing.assert_close(u[..., :3] * s[..., None, :] @ vh, a, **F64)


def test_svd_driver_is_a_clear_error():
    with pytest.raises(ValueError, match="driver"):
        run_lowering(aten._linalg_svd.default, r(3, 3), driver="gesvd")


def test_geqrf_through_the_device_matches_cpu():
    """geqrf has no meta kernel in PyTorch: its shapes come from ``lazy.meta_functions``."""
    a = r(2, 5, 3)
    reflectors, tau = torch.geqrf(a.to("spmd"))
    expected = torch.geqrf(a)
    torch.testing.assert_close(reflectors.cpu(), expected[0], **F64)
    torch.testing.assert_close(tau.cpu(), expected[1], **F64)
