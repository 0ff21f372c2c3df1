"""``_foreach_*`` functional ops (what torch.optim's foreach paths record) -> JAX.

Each is the per-tensor lowering applied to every tensor of the list, with that tensor's
``meta``: PyTorch's own slow path does the same, so dtype rules carry over. A spec string
says how each positional argument maps onto tensor ``i``: ``L`` a list (take item ``i``,
also for ``Scalar[]``, whose items may be 0-d traced arrays), ``T`` a 1-d tensor of one
scalar per tensor (item ``i``), ``S`` the same value for all.
"""

import jax.numpy as jnp
import torch

import torchspmd.lowering.binary  # noqa: F401  (the per-tensor lowerings used below)
import torchspmd.lowering.unary  # noqa: F401
from torchspmd.lowering._common import opmath
from torchspmd.lowering.reductions import vector_norm
from torchspmd.lowering.registry import LOWERINGS, lowers

aten = torch.ops.aten


def _per_tensor(base, spec):
    def lower(meta, *args, **kwargs):
        fn = LOWERINGS[base]
        return [fn(m, *(arg[i] if k in "LT" else arg for k, arg in zip(spec, args)), **kwargs)
                for i, m in enumerate(meta)]
    lower.__name__ = f"foreach_{base.__name__.replace('.', '_')}"
    return lower


_UNARY = ("abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 log1p "
          "log2 neg reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc").split()

_TABLE = {getattr(aten, f"_foreach_{n}").default: (getattr(aten, n).default, "L") for n in _UNARY}
if hasattr(aten, "_foreach_clone"):  # PyTorch >= 2.12 (2.11 has no such op to record)
    _TABLE[aten._foreach_clone.default] = (aten.clone.default, "L")
_TABLE.update({
    # foreach op: (per-tensor op, spec)
    aten._foreach_add.List: (aten.add.Tensor, "LL"),
    aten._foreach_add.Scalar: (aten.add.Scalar, "LS"),
    aten._foreach_add.ScalarList: (aten.add.Scalar, "LL"),
    aten._foreach_add.Tensor: (aten.add.Tensor, "LS"),
    aten._foreach_sub.List: (aten.sub.Tensor, "LL"),
    aten._foreach_sub.Scalar: (aten.sub.Scalar, "LS"),
    aten._foreach_sub.ScalarList: (aten.sub.Scalar, "LL"),
    aten._foreach_mul.List: (aten.mul.Tensor, "LL"),
    aten._foreach_mul.Scalar: (aten.mul.Scalar, "LS"),
    aten._foreach_mul.ScalarList: (aten.mul.Scalar, "LL"),
    aten._foreach_mul.Tensor: (aten.mul.Tensor, "LS"),
    aten._foreach_div.List: (aten.div.Tensor, "LL"),
    aten._foreach_div.Scalar: (aten.div.Scalar, "LS"),
    aten._foreach_div.ScalarList: (aten.div.Scalar, "LL"),
    aten._foreach_div.Tensor: (aten.div.Tensor, "LS"),
    aten._foreach_addcmul.Scalar: (aten.addcmul.default, "LLLS"),
    aten._foreach_addcmul.ScalarList: (aten.addcmul.default, "LLLL"),
    aten._foreach_addcmul.Tensor: (aten.addcmul.default, "LLLT"),
    aten._foreach_addcdiv.Scalar: (aten.addcdiv.default, "LLLS"),
    aten._foreach_addcdiv.ScalarList: (aten.addcdiv.default, "LLLL"),
    aten._foreach_addcdiv.Tensor: (aten.addcdiv.default, "LLLT"),
    aten._foreach_lerp.List: (aten.lerp.Tensor, "LLL"),
    aten._foreach_lerp.Scalar: (aten.lerp.Scalar, "LLS"),
    aten._foreach_lerp.ScalarList: (aten.lerp.Scalar, "LLL"),
    aten._foreach_pow.List: (aten.pow.Tensor_Tensor, "LL"),
    aten._foreach_pow.Scalar: (aten.pow.Tensor_Scalar, "LS"),
    aten._foreach_pow.ScalarList: (aten.pow.Tensor_Scalar, "LL"),
    aten._foreach_pow.ScalarAndTensor: (aten.pow.Scalar, "SL"),
    # PyTorch's foreach maximum/minimum with scalars are clamp_min/clamp_max.
    aten._foreach_maximum.List: (aten.maximum.default, "LL"),
    aten._foreach_maximum.Scalar: (aten.clamp_min.default, "LS"),
    aten._foreach_maximum.ScalarList: (aten.clamp_min.default, "LL"),
    aten._foreach_minimum.List: (aten.minimum.default, "LL"),
    aten._foreach_minimum.Scalar: (aten.clamp_max.default, "LS"),
    aten._foreach_minimum.ScalarList: (aten.clamp_max.default, "LL"),
    aten._foreach_clamp_min.List: (aten.clamp_min.Tensor, "LL"),
    aten._foreach_clamp_min.Scalar: (aten.clamp_min.default, "LS"),
    aten._foreach_clamp_min.ScalarList: (aten.clamp_min.default, "LL"),
    aten._foreach_clamp_max.List: (aten.clamp_max.Tensor, "LL"),
    aten._foreach_clamp_max.Scalar: (aten.clamp_max.default, "LS"),
    aten._foreach_clamp_max.ScalarList: (aten.clamp_max.default, "LL"),
    aten._foreach_max.default: (aten.max.default, "L"),
})

for _op, (_base, _spec) in _TABLE.items():
    lowers(_op)(_per_tensor(_base, _spec))


@lowers(aten._foreach_zero.default)
def foreach_zero(meta, xs):
    return [jnp.zeros(m.shape, m.dtype) for m in meta]


@lowers(aten._foreach_copy.default)
def foreach_copy(meta, xs, src, non_blocking=False):
    return [jnp.broadcast_to(s.astype(m.dtype), m.shape) for m, s in zip(meta, src)]


@lowers(aten._foreach_norm.Scalar)
def foreach_norm(meta, xs, ord=2, dtype=None):
    return [vector_norm(x.astype(opmath(m.dtype)), ord, tuple(range(x.ndim)), False).astype(m.dtype)
            for m, x in zip(meta, xs)]


@lowers(aten._foreach_powsum.Scalar)
def foreach_powsum(meta, xs, ord=2, dtype=None):
    out = []
    for m, x in zip(meta, xs):
        a = jnp.abs(x.astype(opmath(m.dtype)))
        out.append(jnp.sum(a ** ord).astype(m.dtype))
    return out
