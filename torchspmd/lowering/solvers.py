"""Linear solves and the functions built on factorizations: triangular, LU and Cholesky
solves, the inverse, the pseudo-inverse and the matrix exponential.

Batch dims broadcast as in PyTorch (JAX's triangular solve wants them equal, so they are
broadcast here first). ``linalg.solve``, ``det`` and ``slogdet`` are not lowered: they are
composed from ``linalg_lu_factor_ex`` and ``linalg_lu_solve`` on the device (see
``torchspmd.device.linalg_composites``), keeping PyTorch's choice of factoring ``A`` or
``A.mT`` that their backward formulas rely on.

Example: ``torch.linalg.solve_triangular(a, b, upper=True)`` lowers to
``lax.linalg.triangular_solve(a, b, left_side=True, lower=False)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
from torch import ops

from torchspmd.lowering._common import is_complex, outputs_like_meta
from torchspmd.lowering.factorizations import lu_factor, mH
from torchspmd.lowering.registry import lowers

aten = ops.aten
lax_linalg = jax.lax.linalg


def broadcast_batch(*arrays, cores=None):
    """``arrays`` with their batch dims broadcast together, as PyTorch's solvers do.

    ``cores[i]`` is how many trailing dims of ``arrays[i]`` are not batch dims (2, the
    default, for matrices; 1 for an LU pivots vector).
    Example: ``broadcast_batch(a, b)`` for ``a`` (2, 3, 3) and ``b`` (3, 4) gives ``b`` (2, 3, 4).
    """
    cores = cores or [2] * len(arrays)
    batch = jnp.broadcast_shapes(*(a.shape[:a.ndim - c] for a, c in zip(arrays, cores)))
    return [jnp.broadcast_to(a, batch + a.shape[a.ndim - c:]) for a, c in zip(arrays, cores)]


def triangular(a, b, *, lower: bool, left: bool = True, adjoint: bool = False,
               transpose: bool = False, unit: bool = False):
    """Solve ``op(a) @ x = b`` (``left``) or ``x @ op(a) = b`` for triangular ``a``."""
    a, b = broadcast_batch(a, b)
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=lower,
                                       transpose_a=adjoint or transpose,
                                       conjugate_a=adjoint and is_complex(a.dtype),
                                       unit_diagonal=unit)


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(meta, self, B, *, upper, left=True, unitriangular=False):
    a, b = self.astype(meta.dtype), B.astype(meta.dtype)
    return triangular(a, b, lower=not upper, left=left, unit=unitriangular)


@lowers(aten.triangular_solve.default)
def triangular_solve(meta, self, A, upper=True, transpose=False, unitriangular=False):
    x = triangular(A, self, lower=not upper, transpose=transpose, unit=unitriangular)
    return outputs_like_meta(meta, (x, A))


def lu_solve(lu, pivots, b, *, left: bool = True, adjoint: bool = False):
    """Solve ``A x = b`` (or its ``adjoint`` / right-hand variants) from ``getrf`` output."""
    if not left:  # x A = b  <=>  A^H x^H = b^H
        return mH(lu_solve(lu, pivots, mH(b), adjoint=not adjoint))
    lu, pivots, b = broadcast_batch(lu, pivots, b, cores=(2, 1, 2))
    perm = lax_linalg.lu_pivots_to_permutation(pivots - 1, lu.shape[-1])
    if not adjoint:  # A = P L U: x = U^-1 L^-1 P^T b
        pb = jnp.take_along_axis(b, perm[..., None], axis=-2)
        y = lax_linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: x = P L^-H U^-H b
    conj = is_complex(lu.dtype)
    y = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True,
                                    conjugate_a=conj)
    y = lax_linalg.triangular_solve(lu, y, left_side=True, lower=True, transpose_a=True,
                                    conjugate_a=conj, unit_diagonal=True)
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(y, inverse[..., None], axis=-2)


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(meta, LU, pivots, B, *, left=True, adjoint=False):
    return lu_solve(LU, pivots, B.astype(meta.dtype), left=left, adjoint=adjoint).astype(meta.dtype)


@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(meta, A, *, check_errors=False):
    lu, pivots, info, _ = lu_factor(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return outputs_like_meta(meta, (lu_solve(lu, pivots, eye), info))


@lowers(aten.cholesky_solve.default)
def cholesky_solve(meta, self, input2, upper=False):
    # A = L L^H (or U^H U): solve with the factor, then with its adjoint.
    low = mH(input2) if upper else input2
    y = triangular(low, self, lower=True)
    return triangular(low, y, lower=True, adjoint=True).astype(meta.dtype)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(meta, self, upper=False):
    low = mH(self) if upper else self
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    y = triangular(low, eye, lower=True)
    return triangular(low, y, lower=True, adjoint=True).astype(meta.dtype)


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(meta, self):
    if self.shape[-1] == 0:
        return jnp.zeros(meta.shape, meta.dtype)
    return jax.scipy.linalg.expm(self).astype(meta.dtype)


def _tolerances(x, atol, rtol):
    """PyTorch's ``get_atol_rtol``: absolute tolerance 0 by default; relative tolerance
    ``eps * max(m, n)`` unless given, or unless a positive ``atol`` was given."""
    default = np.finfo(x.dtype).eps * max(x.shape[-2:])  # finfo of a complex type is its real part's
    atol_ = jnp.zeros((), jnp.float64) if atol is None else atol.astype(jnp.float64)
    if rtol is not None:
        rtol_ = rtol.astype(jnp.float64)
    elif atol is not None:
        rtol_ = jnp.where(atol_ > 0, 0.0, default)
    else:
        rtol_ = jnp.asarray(default, jnp.float64)
    return atol_, rtol_


@lowers(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(meta, self, *, atol=None, rtol=None, hermitian=False):
    """PyTorch's formula: invert the singular (or eigen-) values above ``max(atol, rtol *
    largest)``, zero the rest."""
    atol_, rtol_ = _tolerances(self, atol, rtol)
    if 0 in self.shape:
        return jnp.zeros(meta.shape, meta.dtype)
    if hermitian:
        s, u = jnp.linalg.eigh(self, UPLO="L", symmetrize_input=False)
        big = jnp.abs(s)
        largest = jnp.max(big, axis=-1, keepdims=True)
        vh = mH(u)
    else:
        u, s, vh = jnp.linalg.svd(self, full_matrices=False)
        big = s
        largest = s[..., :1]
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * largest)
    inv = jnp.where(big > tol, 1 / s, 0).astype(self.dtype)
    return jnp.matmul(mH(vh) * inv[..., None, :], mH(u),
                      precision=jax.lax.Precision.HIGHEST).astype(meta.dtype)

