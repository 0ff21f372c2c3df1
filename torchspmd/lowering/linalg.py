"""Linear-algebra lowerings: mm, bmm, addmm, baddbmm, addbmm, dot, mv, addmv, addr, _trilinear.

``matmul``, ``einsum``, ``outer``, ``F.linear`` and ``F.bilinear`` decompose before dispatch
(CompositeImplicitAutograd) into the ops below plus views.

Numerics follow PyTorch CPU: half types (bf16/f16) multiply with float32 accumulation and are
rounded once at the end; ``beta * self + alpha * (a @ b)`` is computed in that same dtype.
float32 matmuls follow ``torch.set_float32_matmul_precision``: ``"highest"`` (PyTorch's
default) asks XLA for full precision (GPU/TPU would otherwise use TF32/bf16 passes),
``"high"`` for XLA's ``HIGH`` and ``"medium"`` for its ``DEFAULT`` (TF32 on NVIDIA GPUs,
bf16 passes on TPUs); float64 ones always use full precision. The setting is read when a
graph is compiled and is part of its key (``runtime/graph.py``), so changing it compiles
anew rather than reusing a program built for the other.
"""

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import ops

from torchspmd.lowering._common import cast, opmath
from torchspmd.lowering.registry import lowers

aten = ops.aten


_FLOAT32_PRECISION = {"highest": jax.lax.Precision.HIGHEST, "high": jax.lax.Precision.HIGH,
                      "medium": jax.lax.Precision.DEFAULT}


def matmul_precision_setting() -> str:
    """``torch.get_float32_matmul_precision()``: part of every graph's key."""
    return torch.get_float32_matmul_precision()


def precision(dtype):
    """The XLA precision for a dot/conv over ``dtype``: none for half types (accumulated
    in float32), the float32 setting's for float32, full precision for float64.

    >>> precision(np.float64) == jax.lax.Precision.HIGHEST
    True
    """
    if opmath(dtype) != np.dtype(dtype):
        return None
    if np.dtype(dtype) == np.float32:
        return _FLOAT32_PRECISION.get(matmul_precision_setting(), jax.lax.Precision.HIGHEST)
    return jax.lax.Precision.HIGHEST


def dot(a, b, dtype, contract, batch=((), ())):
    """``lax.dot_general`` of ``a`` and ``b`` cast to ``dtype``, accumulated in ``opmath(dtype)``.

    Example: ``dot(x, y, jnp.float32, ((1,), (0,)))`` is ``x @ y`` for 2-d operands.
    """
    acc = opmath(dtype)
    return jax.lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, batch),
                               precision=precision(dtype), preferred_element_type=acc)


def _add_scaled(meta, self, prod, beta, alpha):
    """``beta * self + alpha * prod`` in opmath; ``beta == 0`` ignores ``self`` (NaN included)."""
    acc = opmath(meta.dtype)
    scaled = jnp.where(cast(beta, acc) == 0, cast(0, acc), cast(beta, acc) * self.astype(acc))
    return (scaled + cast(alpha, acc) * prod.astype(acc)).astype(meta.dtype)


@lowers(aten.mm.default)
def mm(meta, self, mat2):
    return dot(self, mat2, meta.dtype, ((1,), (0,))).astype(meta.dtype)


@lowers(aten.bmm.default)
def bmm(meta, self, mat2):
    return dot(self, mat2, meta.dtype, ((2,), (1,)), ((0,), (0,))).astype(meta.dtype)


@lowers(aten.dot.default)
def dot_(meta, self, tensor):
    return dot(self, tensor, meta.dtype, ((0,), (0,))).astype(meta.dtype)


@lowers(aten.mv.default)
def mv(meta, self, vec):
    return dot(self, vec, meta.dtype, ((1,), (0,))).astype(meta.dtype)


@lowers(aten.addmm.default)
def addmm(meta, self, mat1, mat2, *, beta=1, alpha=1):
    return _add_scaled(meta, self, dot(mat1, mat2, meta.dtype, ((1,), (0,))), beta, alpha)


@lowers(aten._addmm_activation.default)
def _addmm_activation(meta, self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    out = addmm(meta, self, mat1, mat2, beta=beta, alpha=alpha).astype(opmath(meta.dtype))
    out = jax.nn.gelu(out, approximate=False) if use_gelu else jnp.maximum(out, 0)  # CPU: erf gelu
    return out.astype(meta.dtype)


@lowers(aten.baddbmm.default)
def baddbmm(meta, self, batch1, batch2, *, beta=1, alpha=1):
    return _add_scaled(meta, self, dot(batch1, batch2, meta.dtype, ((2,), (1,)), ((0,), (0,))), beta, alpha)


@lowers(aten.addbmm.default)
def addbmm(meta, self, batch1, batch2, *, beta=1, alpha=1):
    return _add_scaled(meta, self, dot(batch1, batch2, meta.dtype, ((0, 2), (0, 1))), beta, alpha)


@lowers(aten.addmv.default)
def addmv(meta, self, mat, vec, *, beta=1, alpha=1):
    return _add_scaled(meta, self, dot(mat, vec, meta.dtype, ((1,), (0,))), beta, alpha)


@lowers(aten.addr.default)
def addr(meta, self, vec1, vec2, *, beta=1, alpha=1):
    acc = opmath(meta.dtype)
    return _add_scaled(meta, self, jnp.outer(vec1.astype(acc), vec2.astype(acc)), beta, alpha)


@lowers(aten._trilinear.default)
def _trilinear(meta, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    acc = opmath(meta.dtype)

    def unsqueeze(t, dims):
        t = t.astype(acc)
        for d in dims:
            t = jnp.expand_dims(t, d)
        return t

    prod = unsqueeze(i1, expand1) * unsqueeze(i2, expand2) * unsqueeze(i3, expand3)
    return jnp.sum(prod, axis=tuple(sumdim)).astype(meta.dtype)
