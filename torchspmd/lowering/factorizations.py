"""Matrix factorizations: Cholesky, LU, QR (and its Householder form), eigen- and singular
value decompositions.

Each lowering calls the JAX primitive that runs the same LAPACK routine PyTorch CPU calls
(``potrf``, ``getrf``, ``geqrf``/``orgqr``, ``syevd``, ``geev``, ``gesdd`` on JAX's CPU
backend; cuSOLVER/XLA's own on GPU/TPU), so values match CPU PyTorch, eigen- and singular
vector signs included on CPU. Conventions translated here:

- LU pivots are 1-based ``int32`` (LAPACK's), JAX's are 0-based.
- ``*_ex`` ops return LAPACK's ``info``: 0 on success, ``k`` (1-based) where the
  factorization failed: the first zero pivot of LU, the first leading minor of Cholesky
  that is not positive-definite. Raising on it is ``_linalg_check_errors``'s job (it reads
  ``info`` on the host, see ``torchspmd.device.linalg_composites``).
- Only the triangle PyTorch reads is used (``UPLO`` / ``upper``): no symmetrization.

Example: ``torch.linalg.qr(x)`` on an spmd tensor records ``aten.linalg_qr`` and lowers
to :func:`qr` here, i.e. ``jnp.linalg.qr(x, mode="reduced")``.
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import is_complex, outputs_like_meta
from torchspmd.lowering.registry import lowers

aten = ops.aten
lax_linalg = jax.lax.linalg


def mT(x):
    """The transpose of the last two dims (``Tensor.mT``)."""
    return jnp.swapaxes(x, -1, -2)


def mH(x):
    """The conjugate transpose of the last two dims (``Tensor.mH``)."""
    return jnp.conj(mT(x)) if is_complex(x.dtype) else mT(x)


# --- Cholesky ------------------------------------------------------------------------------

def _cholesky_info(a):
    """LAPACK ``potrf``'s info for each matrix of ``a`` (lower triangle read).

    XLA's Cholesky reports failure as NaNs, not where it failed, so the failing column is
    found again with an unblocked column loop; it only runs when some matrix failed.
    """
    n = a.shape[-1]
    rows = jnp.arange(n)

    def step(j, carry):
        low, info = carry
        row = low[..., j, :]  # columns >= j are still zero
        d = jnp.real(a[..., j, j]) - jnp.sum(jnp.abs(row) ** 2, axis=-1)
        bad = ~(d > 0)  # NaN counts as failure, as in potrf
        info = jnp.where((info == 0) & bad, j + 1, info)
        pivot = jnp.sqrt(jnp.where(bad, 1, d)).astype(a.dtype)
        col = (a[..., :, j] - jnp.einsum("...ik,...k->...i", low, jnp.conj(row))) / pivot[..., None]
        col = jnp.where(rows > j, col, jnp.where(rows == j, pivot[..., None], 0))
        return low.at[..., :, j].set(col), info

    init = (jnp.zeros_like(a), jnp.zeros(a.shape[:-2], jnp.int32))
    return jax.lax.fori_loop(0, n, step, init)[1]


def cholesky_lower(a, upper: bool):
    """``(L, info)`` of ``a`` (``L`` lower; the upper triangle is read when ``upper``)."""
    a = mH(a) if upper else a
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    low = lax_linalg.cholesky(a, symmetrize_input=False)
    failed = jnp.any(jnp.isnan(low))
    info = jax.lax.cond(failed, _cholesky_info, lambda x: jnp.zeros(x.shape[:-2], jnp.int32), a)
    return low, info


@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(meta, self, *, upper=False, check_errors=False):
    low, info = cholesky_lower(self, upper)
    return outputs_like_meta(meta, (mH(low) if upper else low, info))


# --- LU ------------------------------------------------------------------------------------

def lu_factor(a):
    """``(LU, pivots, info, permutation)``: LAPACK's 1-based pivots and info, and the
    0-based row permutation with ``a[..., perm, :] == L @ U``."""
    lu, pivots, perm = lax_linalg.lu(a)
    if 0 in a.shape[-2:]:
        return lu, pivots + 1, jnp.zeros(a.shape[:-2], jnp.int32), perm
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, pivots + 1, info, perm


def _no_pivoting(op: str):
    return NotImplementedError(
        f"torchspmd: {op}(pivot=False) is not supported (as on CPU PyTorch): LU without "
        "pivoting is not implemented; use pivot=True.")


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(meta, A, *, pivot=True, check_errors=False):
    if not pivot:
        raise _no_pivoting("linalg.lu_factor")
    lu, pivots, info, _ = lu_factor(A)
    return outputs_like_meta(meta, (lu, pivots, info))


def unpack(lu, perm, dtype):
    """``(P, L, U)`` with ``A = P @ L @ U`` from a packed LU and its row permutation."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    low = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    up = jnp.triu(lu[..., :k, :])
    # Row i of L @ U is row perm[i] of A, so P[perm[i], i] = 1.
    p = mT(jax.nn.one_hot(perm, m, dtype=dtype))
    return p, low, up


@lowers(aten.linalg_lu.default)
def linalg_lu(meta, A, *, pivot=True):
    if not pivot:
        raise _no_pivoting("linalg.lu")
    lu, _, _, perm = lu_factor(A)
    return outputs_like_meta(meta, unpack(lu, perm, meta[0].dtype))


@lowers(aten.lu_unpack.default)
def lu_unpack(meta, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m = LU_data.shape[-2]
    perm = lax_linalg.lu_pivots_to_permutation(LU_pivots.astype(jnp.int32) - 1, m)
    return outputs_like_meta(meta, unpack(LU_data, perm, LU_data.dtype))


# --- QR and Householder reflectors --------------------------------------------------------

@lowers(aten.linalg_qr.default)
def linalg_qr(meta, A, mode="reduced"):
    if mode == "r":
        return outputs_like_meta(meta, (None, jnp.linalg.qr(A, mode="r")))
    return outputs_like_meta(meta, jnp.linalg.qr(A, mode=mode))


@lowers(aten.geqrf.default)
def geqrf(meta, self):
    h, tau = jnp.linalg.qr(self, mode="raw")  # numpy's raw mode returns the reflectors transposed
    return outputs_like_meta(meta, (mT(h), tau))


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(meta, input, tau):
    return lax_linalg.householder_product(input, tau).astype(meta.dtype)


@lowers(aten.ormqr.default)
def ormqr(meta, self, input2, input3, left=True, transpose=False):
    return lax_linalg.ormqr(self, input2, input3, left=left, transpose=transpose).astype(meta.dtype)


# --- eigen- and singular value decompositions ---------------------------------------------

@lowers(aten._linalg_eigh.default)
def linalg_eigh(meta, A, UPLO="L", compute_v=True):
    vectors, values = lax_linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    return outputs_like_meta(meta, (values, vectors))


@lowers(aten.linalg_eig.default)
def linalg_eig(meta, self):
    values, vectors = lax_linalg.eig(self, compute_left_eigenvectors=False)
    return outputs_like_meta(meta, (values, vectors))


@lowers(aten._linalg_svd.default)
def linalg_svd(meta, A, full_matrices=False, compute_uv=True, *, driver=None):
    if driver is not None:
        raise ValueError("torchspmd: torch.linalg.svd(driver=...) selects a cuSOLVER routine; "
                         "the spmd device chooses its own SVD, call it without driver=.")
    if not compute_uv:
        return outputs_like_meta(meta, (None, jnp.linalg.svd(A, compute_uv=False), None))
    return outputs_like_meta(meta, jnp.linalg.svd(A, full_matrices=full_matrices))
