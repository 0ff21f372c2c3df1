"""Elementwise aten ops of one tensor -> JAX: math functions, predicates, casts.

Every lowering computes in ``opmath(meta.dtype)`` (float32 for half types, as PyTorch's
CPU kernels do) with its input cast explicitly, and returns ``meta.dtype``. Ops of the
same shape of code are registered from tables.
"""

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch
from jax import lax

from torchspmd.lowering._common import cast, is_complex, is_floating, opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _digamma(x):
    # PyTorch: digamma(+-0) = -+inf (JAX gives nan).
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), lax.digamma(x))


def _sinc(x):
    # sin(pi x) / (pi x) is NaN at +-inf, as in PyTorch; JAX 0.11's jnp.sinc says 0 there.
    return jnp.where(jnp.isinf(x), jnp.nan, jnp.sinc(x))


def _entr(x):
    return jnp.where(jnp.isnan(x), x,
                     jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)),
                               jnp.where(x == 0, 0.0, -jnp.inf)).astype(x.dtype))


# Result is floating; inputs (int too) are cast to opmath(meta.dtype) first.
_FLOAT_UNARY = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.reciprocal.default: jnp.reciprocal,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.sinc.default: _sinc,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
    aten.lgamma.default: lax.lgamma,
    aten.digamma.default: _digamma,
    aten.i0.default: jsp.i0,
    aten.special_i0e.default: jsp.i0e,
    aten.special_i1.default: jsp.i1,
    aten.special_i1e.default: jsp.i1e,
    aten.special_ndtri.default: jsp.ndtri,
    aten.special_log_ndtr.default: jsp.log_ndtr,
    aten.special_entr.default: _entr,
    aten.angle.default: lambda x: jnp.angle(x) if is_complex(x.dtype) else jnp.where(
        jnp.isnan(x), x, jnp.where(x < 0, np.pi, 0.0).astype(x.dtype)),
}


def _sign(x):
    # PyTorch: (0 < x) - (x < 0), so sign(nan) = 0; bool is its own sign; sgn(z) = z / |z|.
    if is_complex(x.dtype):
        return jnp.where(x == 0, jnp.zeros_like(x), x / jnp.abs(x))
    return x if x.dtype == np.bool_ else (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _float_only(fn):
    """``fn`` on floating values; the identity on integers and bool (floor, round, ...)."""
    return lambda x: fn(x) if is_floating(x.dtype) else x


# Result dtype is the input's; computed in opmath(meta.dtype).
_SAME_UNARY = {
    aten.neg.default: jnp.negative,
    aten.abs.default: jnp.abs,
    aten.sign.default: _sign,
    aten.sgn.default: _sign,
    aten.floor.default: _float_only(jnp.floor),
    aten.ceil.default: _float_only(jnp.ceil),
    aten.round.default: _float_only(jnp.round),
    aten.trunc.default: _float_only(jnp.trunc),
    aten.frac.default: lambda x: x - jnp.trunc(x),
    aten.bitwise_not.default: jnp.invert,
}

# Identities at the value level (copies, conjugation of real tensors): no upcast.
# (alias/detach are view ops: shape.py lowers them.)
_IDENTITY = {
    aten.clone.default: lambda x: x,
    aten.lift_fresh.default: lambda x: x,
    aten.lift_fresh_copy.default: lambda x: x,
    aten._conj.default: jnp.conj,
    aten._conj_physical.default: jnp.conj,
    aten.conj_physical.default: jnp.conj,
}

# Boolean result computed on the input as it is.
_PREDICATES = {
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
    aten.signbit.default: jnp.signbit,
    aten.logical_not.default: lambda x: x == 0,
}


def _register_unary(table, upcast):
    for op, fn in table.items():
        def lower(meta, x, *_, _fn=fn, **__):  # extra args: clone's memory_format
            dtype = opmath(meta.dtype) if upcast else meta.dtype
            if is_complex(x.dtype):  # abs/angle: complex in, real out
                dtype = x.dtype
            return _fn(x.astype(dtype)).astype(meta.dtype)
        lower.__name__ = op.__name__.replace(".", "_")
        lowers(op)(lower)


_register_unary(_FLOAT_UNARY, upcast=True)
_register_unary(_SAME_UNARY, upcast=True)
_register_unary(_IDENTITY, upcast=False)


def _predicate(fn, name):
    def lower(meta, x):
        return fn(x).astype(meta.dtype)
    lower.__name__ = name
    return lower


for _op, _fn in _PREDICATES.items():
    lowers(_op)(_predicate(_fn, _op.__name__.split(".")[0]))


@lowers(aten._to_copy.default)
def _to_copy(meta, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if meta.dtype == jnp.uint8 and jnp.issubdtype(x.dtype, jnp.floating):
        # PyTorch casts floats to uint8 through int64 on every device (c10's TypeCast),
        # so -1.0 becomes 255 and 300.0 becomes 44; XLA's direct cast saturates.
        return x.astype(jnp.int64).astype(jnp.uint8)
    return x.astype(meta.dtype)


@lowers(aten.round.decimals)
def round_decimals(meta, x, *, decimals):
    x = x.astype(opmath(meta.dtype))
    if decimals >= 0:
        return (jnp.round(x * 10.0 ** decimals) / 10.0 ** decimals).astype(meta.dtype)
    p = 10.0 ** -decimals
    return (jnp.round(x / p) * p).astype(meta.dtype)


@lowers(aten.logit.default)
def logit(meta, x, eps=None):
    x = x.astype(opmath(meta.dtype))
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1 - x)).astype(meta.dtype)


@lowers(aten.nan_to_num.default)
def nan_to_num(meta, x, nan=None, posinf=None, neginf=None):
    if not is_floating(meta.dtype):
        return x.astype(meta.dtype)
    info = jnp.finfo(meta.dtype)
    x = x.astype(meta.dtype)
    x = jnp.where(jnp.isnan(x), cast(0.0 if nan is None else nan, meta.dtype), x)
    x = jnp.where(jnp.isposinf(x), cast(info.max if posinf is None else posinf, meta.dtype), x)
    return jnp.where(jnp.isneginf(x), cast(info.min if neginf is None else neginf, meta.dtype), x)


@lowers(aten.mvlgamma.default)
def mvlgamma(meta, x, p):
    x = x.astype(opmath(meta.dtype))
    out = sum(lax.lgamma(x - j / 2) for j in range(p)) + p * (p - 1) / 4 * np.log(np.pi)
    return out.astype(meta.dtype)


@lowers(aten.frexp.Tensor)
def frexp(meta, x):
    mantissa, exponent = jnp.frexp(x.astype(meta[0].dtype))
    return mantissa, exponent.astype(meta[1].dtype)
