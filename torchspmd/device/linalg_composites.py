"""Linear-algebra ops that run on the spmd device as compositions of other ops.

PyTorch's C++ kernels for these compose other aten ops; doing the same here (instead of
one lowering each) keeps these as on CPU:

- **Errors.** ``_linalg_check_errors`` reads a factorization's ``info`` on the host (one
  sync, as on CUDA; through ``host_read``, so it is refused inside a compiled step) and
  raises CPU PyTorch's own error (``torch.linalg.inv`` of a singular matrix,
  ``torch.linalg.cholesky`` of one that is not positive-definite). The ``*_ex`` variants
  never sync: they return ``info``.
- **Which matrix is factored.** ``det`` and ``slogdet`` factor ``A.mT`` when ``A`` is
  contiguous and real, ``A`` otherwise (``linalg.solve`` always factors ``A``); their
  backward formulas reuse the returned ``LU`` assuming that choice, so it is made the same
  way here.
- **Ops without a meta kernel** (``linalg_lstsq``, whose outputs' shapes depend on the
  driver and, for some drivers, on the rank of the data).

Example: ``torch.linalg.det(a)`` on an spmd tensor records ``linalg_lu_factor_ex`` of
``a.mT``, then the product of the LU diagonal times the permutation's sign.
"""

import torch

from torchspmd.device.host import host_read

aten = torch.ops.aten


def _linalg_check_errors(info, api_name: str, *, is_matrix: bool) -> None:
    info = host_read(info, api_name, "to check that the factorization succeeded")
    torch._linalg_check_errors(info, api_name, is_matrix=is_matrix)


def _cholesky(self, upper: bool = False):
    low, info = torch.linalg.cholesky_ex(self, upper=upper)
    torch._linalg_check_errors(info, "cholesky", is_matrix=self.dim() == 2)
    return low


def _det_factor(A):
    """``(LU, pivots)``: the LU factorization PyTorch's det kernels make (of ``A`` or ``A.mT``)."""
    use_A_T = A.is_contiguous() and not A.is_complex()
    LU, pivots, _ = torch.linalg.lu_factor_ex(A.mT if use_A_T else A)
    return LU, pivots


def _permutation_sign(pivots):
    """``det(P)`` of the row interchanges ``pivots``: -1 for an odd number of swaps."""
    n = pivots.shape[-1]
    swaps = (torch.arange(1, n + 1, dtype=pivots.dtype, device=pivots.device) != pivots).sum(-1)
    return 1 - 2 * (swaps % 2)


def _linalg_solve_ex(A, B, *, left: bool = True, check_errors: bool = False):
    LU, pivots, info = torch.linalg.lu_factor_ex(A)  # A itself, whatever its layout
    if check_errors:
        torch._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    # numpy's rule: B is a (batch of) vector(s) when it has one dim fewer than A.
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    result = torch.linalg.lu_solve(LU, pivots, B.unsqueeze(-1) if vector else B, left=left)
    return result.squeeze(-1) if vector else result, LU, pivots, info


def _linalg_det(A):
    LU, pivots = _det_factor(A)
    det = _permutation_sign(pivots) * LU.diagonal(0, -2, -1).prod(-1)
    return det, LU, pivots


def _linalg_slogdet(A):
    LU, pivots = _det_factor(A)
    diag = LU.diagonal(0, -2, -1)
    sign = _permutation_sign(pivots) * diag.sgn().prod(-1)
    return sign, diag.abs().log().sum(-1), LU, pivots


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _first_zero_on_diagonal(r):
    """LAPACK's info for a triangular solve with ``r``: 1 + the first exactly zero pivot, or 0."""
    zero = (r.diagonal(0, -2, -1) == 0).to(torch.int32)
    return torch.where(zero.sum(-1) > 0, zero.argmax(-1).to(torch.int32) + 1, 0)


def _linalg_lstsq(A, B, rcond=None, *, driver=None):
    """Least squares through the SVD: the minimum-norm solution every LAPACK driver returns
    for its rank (``gels`` assumes full rank and raises where CPU's does, on an exactly zero
    pivot of ``R``). The outputs a driver does not fill are empty, as on CPU; the residuals
    of ``gelsd``/``gelss`` exist only for full-rank inputs, which costs one host read, as on
    CPU."""
    driver = driver or "gelsy"
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of "
                           "(gels, gelsy, gelsd, gelss)")
    vector = A.dim() - B.dim() == 1
    B2 = B.unsqueeze(-1) if vector else B
    m, n = A.shape[-2:]
    if driver == "gels":
        r = torch.linalg.qr(A if m >= n else A.mH, mode="r").R
        torch._linalg_check_errors(_first_zero_on_diagonal(r), "torch.linalg.lstsq",
                                   is_matrix=A.dim() == 2)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    eps = torch.finfo(S.dtype).eps
    rcond = eps * max(m, n) if rcond is None else eps if rcond < 0 else rcond  # LAPACK's rule
    keep = S > (0 if driver == "gels" else rcond) * S[..., :1]
    inverse = torch.where(keep, S.reciprocal(), 0).to(A.dtype)
    solution = Vh.mH @ (inverse.unsqueeze(-1) * (U.mH @ B2))
    rank = keep.sum(-1)
    residuals = S.new_empty(0)  # real, like the residuals themselves
    if m > n and driver != "gelsy":
        if driver == "gels" or bool(host_read((rank == n).all(), "torch.linalg.lstsq")):
            residuals = (A @ solution - B2).abs().pow(2).sum(-2)
    return (solution.squeeze(-1) if vector else solution, residuals,
            rank if driver != "gels" else rank.new_empty(0),
            S if driver in ("gelsd", "gelss") else S.new_empty(0))


# aten overload -> the function dispatch runs instead of recording the op.
LINALG_COMPOSITES = {
    aten._linalg_check_errors.default: _linalg_check_errors,
    aten.cholesky.default: _cholesky,
    aten._linalg_solve_ex.default: _linalg_solve_ex,
    aten._linalg_det.default: _linalg_det,
    aten._linalg_slogdet.default: _linalg_slogdet,
    aten.linalg_lstsq.default: _linalg_lstsq,
}
