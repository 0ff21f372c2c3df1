"""Grouped matmul (``aten._grouped_mm``, ``F.grouped_mm``): the mixture-of-experts kernel,
lowered to ``jax.lax.ragged_dot_general``.

``offs`` holds the cumulative ends of the groups (int32, one per group). The four layouts,
all reached by HF's expert implementations and by PyTorch's backward formula for the op
(which calls ``_grouped_mm`` again on transposed operands):

- 2-d x 3-d, ``offs``: rows of ``a`` (M, K) in group g use ``b[g]`` (G, K, N) -> (M, N).
  The forward of a MoE layer, and the input gradient of it.
- 2-d x 2-d, ``offs``: the contracted dim is ragged: ``out[g] = a[:, rows_g] @ b[rows_g]``
  -> (G, K, N). The weight gradient.
- 3-d x 2-d, ``offs``: the columns of ``b`` (K, N) in group g use ``a[g]`` (G, M, K) -> (M, N).
- 3-d x 3-d, no ``offs``: a batched matmul.

Rows (or columns) past ``offs[-1]`` are zero here; PyTorch's kernels leave them
uninitialized, so callers never read them. Half types accumulate in float32 and round once,
as PyTorch CPU does; float32 asks XLA for full precision (see ``linalg.precision``).
"""

import jax
import jax.numpy as jnp
import torch
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.lowering.linalg import dot, precision
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(f"torch._grouped_mm: {message}")


@infers(aten._grouped_mm.default)
def _grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """Output shape and dtype, with the checks of PyTorch's CPU kernel.

    PyTorch's meta kernel follows the CUDA one, which accepts bfloat16 only; the CPU kernel
    (whose numbers the device matches) also takes float32 and float16.
    """
    _check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
           f"multiplicands must be 2-d or 3-d, got {mat_a.dim()}-d and {mat_b.dim()}-d")
    _check(mat_a.dtype == mat_b.dtype and mat_a.dtype in _DTYPES,
           f"expected float32, bfloat16 or float16 operands of one dtype, got {mat_a.dtype} "
           f"and {mat_b.dtype}")
    _check(bias is None, "bias is not supported (PyTorch's kernels reject it too); add the bias "
           "to the result instead")
    _check(out_dtype is None or out_dtype == mat_a.dtype,
           f"out_dtype must be the operands' dtype ({mat_a.dtype}), got {out_dtype}")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        _check(mat_a.size(1) == mat_b.size(0),
               f"contracted sizes differ: {tuple(mat_a.shape)} and {tuple(mat_b.shape)}")
    else:
        _check(mat_a.size(-1) == mat_b.size(-2),
               f"contracted sizes differ: {tuple(mat_a.shape)} and {tuple(mat_b.shape)}")
    if a2 or b2:
        _check(offs is not None, "offs is required when an operand is 2-d")
        _check(offs.dim() == 1 and offs.dtype == torch.int32,
               f"offs must be a 1-d int32 tensor, got {offs.dim()}-d {offs.dtype}")
    else:
        _check(offs is None, "offs must be None for 3-d x 3-d operands")
        _check(mat_a.size(0) == mat_b.size(0), "batch sizes of 3-d operands differ")
    if a2 and b2:
        shape = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif a2:
        _check(offs.size(0) == mat_b.size(0), "offs and mat_b have different numbers of groups")
        shape = (mat_a.size(0), mat_b.size(-1))
    elif b2:
        _check(offs.size(0) == mat_a.size(0), "offs and mat_a have different numbers of groups")
        shape = (mat_a.size(1), mat_b.size(1))
    else:
        shape = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    return mat_a.new_empty(shape)


def group_sizes(offs):
    """Sizes of the groups whose cumulative ends are ``offs``: ``[2, 2, 7] -> [2, 0, 5]``.

    Written as a sum over a bidiagonal (+1, -1) mask rather than ``jnp.diff``: XLA shards
    ``offs`` like the experts, and each grouped matmul of a step (the forward's and the
    backward's) computes its own sizes; ``diff`` needs the neighbouring device's last
    offset (a collective-permute, then an all-gather) for each of them, the masked sum one
    all-gather. One MoE layer's forward and backward go from 21 all-gathers and 10
    collective-permutes to 13 and 4 on a (4, 2) mesh (``benchmarks/moe.py``).
    """
    offs = offs.astype(jnp.int32)
    g = offs.shape[0]
    step = jnp.eye(g, dtype=jnp.int32) - jnp.eye(g, k=-1, dtype=jnp.int32)
    return (step * offs[None, :]).sum(1)


def _ragged(a, b, sizes, dtype, contract, lhs_ragged, rhs_group):
    """``lax.ragged_dot_general`` of ``a`` and ``b`` in ``dtype``, accumulated in opmath."""
    numbers = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(contract, ((), ())),
        lhs_ragged_dimensions=(lhs_ragged,), rhs_group_dimensions=rhs_group)
    return jax.lax.ragged_dot_general(a.astype(dtype), b.astype(dtype), sizes, numbers,
                                      precision=precision(dtype),
                                      preferred_element_type=opmath(dtype))


@lowers(aten._grouped_mm.default)
def grouped_mm(meta, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    dtype = to_jax_dtype(out_dtype) if out_dtype is not None else meta.dtype
    a2, b2 = mat_a.ndim == 2, mat_b.ndim == 2
    if not (a2 or b2):
        out = dot(mat_a, mat_b, dtype, ((2,), (1,)), ((0,), (0,)))
    elif a2 and not b2:  # (M, K) x (G, K, N): rows are grouped
        out = _ragged(mat_a, mat_b, group_sizes(offs), dtype, ((1,), (1,)), 0, (0,))
    elif a2 and b2:  # (K, M) x (M, N): the contracted dim is grouped -> (G, K, N)
        out = _ragged(mat_a, mat_b, group_sizes(offs), dtype, ((1,), (0,)), 1, ())
    else:  # (G, M, K) x (K, N): columns of b are grouped; as (N, K) x (G, K, M), transposed
        out = _ragged(mat_b.T, jnp.swapaxes(mat_a, 1, 2), group_sizes(offs), dtype,
                      ((1,), (1,)), 0, (0,)).T
    return out.astype(meta.dtype)
