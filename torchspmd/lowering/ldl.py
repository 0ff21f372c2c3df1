"""LDL^T factorization of symmetric indefinite matrices, and the solve that uses it.

JAX has no ``sytrf``, and PyTorch returns LAPACK's packed format (``L`` and the 1x1/2x2
blocks of ``D`` in the lower triangle, interchanges in ``pivots``, negative for a 2x2
block), so LAPACK's unblocked Bunch-Kaufman algorithm (``dsytf2``/``dsytrs``, lower) is
written out here as a ``while_loop`` over pivots: same pivot choices, same format. Each
step costs O(n^2) work, so a factorization is O(n^3) like LAPACK's, but sequential in n.

Real matrices only (for them ``hermitian=True`` is the same factorization); complex
inputs raise an error naming the op.

Example: ``torch.linalg.ldl_factor(a)`` lowers to :func:`linalg_ldl_factor_ex`.
"""

import math

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import is_complex, outputs_like_meta
from torchspmd.lowering.registry import lowers
from torchspmd.lowering.solvers import broadcast_batch

aten = ops.aten

# Bunch-Kaufman's threshold: balances element growth between 1x1 and 2x2 pivots.
_ALPHA = (1 + math.sqrt(17)) / 8


def _real_only(op: str, x):
    if is_complex(x.dtype):
        raise NotImplementedError(f"torchspmd: {op} of complex matrices is not supported on "
                                  "the spmd device; move the tensor to the CPU (t.cpu()) for it.")


def _factor(a):
    """``dsytf2`` (lower) of one matrix: ``(LD, pivots, info)`` in LAPACK's format."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    lower = idx[:, None] >= idx[None, :]

    def body(state):
        s, ipiv, info, k = state
        s = jnp.where(lower, s, s.T)  # the trailing matrix as LAPACK sees it: its lower part
        below = idx > k
        col = jnp.where(below, jnp.abs(s[:, k]), -1)
        imax = jnp.argmax(col)
        colmax = jnp.where(k < n - 1, col[imax], 0)
        absakk = jnp.abs(s[k, k])
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        rowmax = jnp.max(jnp.where((idx >= k) & (idx != imax), jnp.abs(s[imax]), -1))
        # Pivot on A[k, k] (1x1) unless column k has a much larger entry.
        keep_k = (zero | (absakk >= _ALPHA * colmax)
                  | (absakk >= _ALPHA * colmax * (colmax / rowmax)))
        kstep = jnp.where(keep_k | (jnp.abs(s[imax, imax]) >= _ALPHA * rowmax), 1, 2)
        kp = jnp.where(keep_k, k, imax)
        kk = k + kstep - 1
        # Interchange rows and columns kk and kp of the trailing matrix only.
        p = idx.at[kk].set(kp).at[kp].set(kk)
        trailing = (idx[:, None] >= k) & (idx[None, :] >= k)
        s = jnp.where(trailing, s[p][:, p], s)
        # 1x1 pivot: rank-1 update, then scale the column into L.
        x = jnp.where(below, s[:, k], 0)
        d11 = 1 / s[k, k]
        one = s - d11 * jnp.outer(x, x)
        one = jnp.where(below[:, None] & below[None, :], one, s)
        one = one.at[:, k].set(jnp.where(below, x * d11, s[:, k]))
        # 2x2 pivot: rank-2 update with the inverse of the 2x2 block.
        below2 = idx > k + 1
        xk, xk1 = jnp.where(below2, s[:, k], 0), jnp.where(below2, s[:, k + 1], 0)
        d21 = s[k + 1, k]
        e11, e22 = s[k + 1, k + 1] / d21, s[k, k] / d21
        d21 = (1 / (e11 * e22 - 1)) / d21
        wk, wk1 = d21 * (e11 * xk - xk1), d21 * (e22 * xk1 - xk)
        two = s - (jnp.outer(xk, wk) + jnp.outer(xk1, wk1))
        two = jnp.where(below2[:, None] & below2[None, :], two, s)
        two = two.at[:, k].set(jnp.where(below2, wk, s[:, k]))
        two = two.at[:, k + 1].set(jnp.where(below2, wk1, s[:, k + 1]))
        s = jnp.where(zero, s, jnp.where(kstep == 1, one, two))
        piv = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        ipiv = ipiv.at[k].set(piv)
        ipiv = jnp.where((kstep == 2) & (idx == k + 1), piv, ipiv)
        info = jnp.where((info == 0) & zero, k + 1, info).astype(jnp.int32)
        return s, ipiv, info, k + kstep

    init = (a, jnp.zeros(n, jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    s, ipiv, info, _ = jax.lax.while_loop(lambda st: st[3] < n, body, init)
    return jnp.tril(s), ipiv, info


def _vmap_batch(fn, batch_ndim: int):
    for _ in range(batch_ndim):
        fn = jax.vmap(fn)
    return fn


@lowers(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(meta, self, *, hermitian=False, check_errors=False):
    _real_only("linalg.ldl_factor", self)
    if 0 in self.shape:  # nothing to factor: empty outputs, info 0 (success)
        return tuple(jnp.zeros(m.shape, m.dtype) for m in meta)
    return outputs_like_meta(meta, _vmap_batch(_factor, self.ndim - 2)(self))


def _solve(ld, ipiv, b):
    """``dsytrs`` (lower) of one system: ``A x = b`` from ``dsytrf``'s output."""
    n = ld.shape[-1]
    idx = jnp.arange(n)

    def swap(b, i, j):
        p = idx.at[i].set(j).at[j].set(i)
        return b[p]

    def forward(state):  # solve L D y = P^T b, pivot block by pivot block
        b, k = state
        two = ipiv[k] < 0
        kp = jnp.where(two, -ipiv[k], ipiv[k]) - 1
        b = swap(b, jnp.where(two, k + 1, k), kp)
        below, below2 = idx > k, idx > k + 1
        one = b - jnp.outer(jnp.where(below, ld[:, k], 0), b[k])
        one = one.at[k].set(b[k] / ld[k, k])
        two_b = b - jnp.outer(jnp.where(below2, ld[:, k], 0), b[k])
        two_b = two_b - jnp.outer(jnp.where(below2, ld[:, k + 1], 0), b[k + 1])
        akm1k = ld[k + 1, k]
        akm1, ak = ld[k, k] / akm1k, ld[k + 1, k + 1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = two_b[k] / akm1k, two_b[k + 1] / akm1k
        two_b = two_b.at[k].set((ak * bkm1 - bk) / denom)
        two_b = two_b.at[k + 1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, two_b, one), k + jnp.where(two, 2, 1)

    def backward(state):  # solve L^T x = y, then undo the interchanges
        b, k = state
        two = ipiv[k] < 0
        below = idx > k
        b = b.at[k].add(-jnp.where(below, ld[:, k], 0) @ b)
        b = jnp.where(two, b.at[k - 1].add(-jnp.where(below, ld[:, k - 1], 0) @ b), b)
        kp = jnp.where(two, -ipiv[k], ipiv[k]) - 1
        return swap(b, k, kp), k - jnp.where(two, 2, 1)

    index = jnp.zeros((), jnp.int32)
    b, _ = jax.lax.while_loop(lambda st: st[1] < n, forward, (b, index))
    b, _ = jax.lax.while_loop(lambda st: st[1] >= 0, backward, (b, index + n - 1))
    return b


@lowers(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(meta, LD, pivots, B, *, hermitian=False):
    _real_only("linalg.ldl_solve", LD)
    if 0 in meta.shape:
        return jnp.zeros(meta.shape, meta.dtype)
    ld, ipiv, b = broadcast_batch(LD, pivots, B.astype(LD.dtype), cores=(2, 1, 2))
    return _vmap_batch(_solve, b.ndim - 2)(ld, ipiv, b).astype(meta.dtype)
