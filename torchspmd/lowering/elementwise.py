"""Elementwise aten ops -> JAX: arithmetic, math functions, comparisons, logic, casts.

Every lowering computes in ``opmath(meta.dtype)`` (float32 for half types, as PyTorch's
CPU kernels do) with its inputs cast explicitly, and returns ``meta.dtype``. Ops of the
same shape of code are registered from tables.
"""

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch
from jax import lax

from torchspmd.lowering._common import cast, is_complex, is_floating, opmath, result_type
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _is_one(v) -> bool:
    """``v`` is the Python number 1 (a static default, never a traced value)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _scaled(y, alpha, dtype):
    return y if _is_one(alpha) else y * cast(alpha, dtype)


# --------------------------------------------------------------------------- unary

def _digamma(x):
    # PyTorch: digamma(+-0) = -+inf (JAX gives nan).
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), lax.digamma(x))


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
    aten.sinc.default: jnp.sinc,
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
    aten.special_erfcx.default: jsp.erfcx,
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


@lowers(aten.polygamma.default)
def polygamma(meta, n, x):
    x = x.astype(opmath(meta.dtype))
    return (_digamma(x) if n == 0 else jsp.polygamma(n, x)).astype(meta.dtype)


@lowers(aten.frexp.Tensor)
def frexp(meta, x):
    mantissa, exponent = jnp.frexp(x.astype(meta[0].dtype))
    return mantissa, exponent.astype(meta[1].dtype)


# -------------------------------------------------------------------------- binary

def _floor_divide(a, b):
    if not is_floating(a.dtype):
        return jnp.floor_divide(a, b)
    # PyTorch's div_floor_floating (Python's float floor division).
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _trunc_divide(a, b):
    if is_floating(a.dtype):
        return jnp.trunc(a / b)
    a, b = jnp.broadcast_arrays(a, b)  # lax ops do not broadcast
    return lax.div(a, b)


def _remainder(a, b):
    if not is_floating(a.dtype):
        return jnp.remainder(a, b)
    mod = jnp.fmod(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def _xlogy(log):
    def fn(x, y):
        return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * log(y)))
    return fn


# (self, other) -> result, both cast to opmath(meta.dtype).
_BINARY = {
    (aten.mul.Tensor, aten.mul.Scalar): jnp.multiply,
    (aten.div.Tensor, aten.div.Scalar): jnp.true_divide,
    (aten.floor_divide.default, aten.floor_divide.Scalar): _floor_divide,
    (aten.pow.Tensor_Tensor, aten.pow.Scalar): jnp.power,
    (aten.atan2.default,): jnp.arctan2,
    (aten.hypot.default,): jnp.hypot,
    (aten.copysign.Tensor, aten.copysign.Scalar): jnp.copysign,
    (aten.maximum.default,): jnp.maximum,
    (aten.minimum.default,): jnp.minimum,
    (aten.fmax.default,): jnp.fmax,
    (aten.fmin.default,): jnp.fmin,
    (aten.fmod.Tensor, aten.fmod.Scalar): jnp.fmod,
    (aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor): _remainder,
    (aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self): _xlogy(jnp.log),
    (aten.special_xlog1py.default, aten.special_xlog1py.other_scalar,
     aten.special_xlog1py.self_scalar): _xlogy(jnp.log1p),
    (aten.heaviside.default,): lambda x, v: jnp.where(x == 0, v, (x > 0).astype(x.dtype)),
    (aten.logaddexp.default,): jnp.logaddexp,
    (aten.logaddexp2.default,): jnp.logaddexp2,
    (aten.ldexp.Tensor,): lambda x, e: x * jnp.exp2(e),
    (aten.gcd.default,): jnp.gcd,
    (aten.lcm.default,): jnp.lcm,
    (aten.igamma.default,): jsp.gammainc,
    (aten.igammac.default,): jsp.gammaincc,
    (aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar): jsp.zeta,
    (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor): jnp.bitwise_and,
    (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor): jnp.bitwise_or,
    (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor): jnp.bitwise_xor,
    (aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
     aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar): jnp.left_shift,
    (aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
     aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar): jnp.right_shift,
}

def _binary(fn, name):
    def lower(meta, a, b):
        dtype = opmath(meta.dtype)
        return fn(cast(a, dtype), cast(b, dtype)).astype(meta.dtype)
    lower.__name__ = name
    return lower


for _ops, _fn in _BINARY.items():
    lowers(*_ops)(_binary(_fn, _ops[0].__name__.split(".")[0]))


@lowers(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(meta, x, exponent):
    dtype = opmath(meta.dtype)
    if isinstance(exponent, int) and not isinstance(exponent, bool) and abs(exponent) <= 4:
        # A static small integer power: repeated multiplication, as PyTorch's CPU kernel.
        return lax.integer_pow(x.astype(dtype), exponent).astype(meta.dtype)
    return jnp.power(x.astype(dtype), cast(exponent, dtype)).astype(meta.dtype)


@lowers(aten.nextafter.default)
def nextafter(meta, a, b):
    return jnp.nextafter(a.astype(meta.dtype), b.astype(meta.dtype))  # no upcast: ulp of meta.dtype


@lowers(aten.add.Tensor, aten.add.Scalar)
def add(meta, x, other, alpha=1):
    dtype = opmath(meta.dtype)
    return (cast(x, dtype) + _scaled(cast(other, dtype), alpha, dtype)).astype(meta.dtype)


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def sub(meta, x, other, alpha=1):
    dtype = opmath(meta.dtype)
    return (cast(x, dtype) - _scaled(cast(other, dtype), alpha, dtype)).astype(meta.dtype)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(meta, x, other, alpha=1):
    dtype = opmath(meta.dtype)
    return (cast(other, dtype) - _scaled(cast(x, dtype), alpha, dtype)).astype(meta.dtype)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(meta, x, other, *, rounding_mode=None):
    dtype = opmath(meta.dtype)
    fn = {None: jnp.true_divide, "trunc": _trunc_divide, "floor": _floor_divide}[rounding_mode]
    return fn(cast(x, dtype), cast(other, dtype)).astype(meta.dtype)


@lowers(aten.addcmul.default)
def addcmul(meta, x, tensor1, tensor2, value=1):
    dtype = opmath(meta.dtype)
    prod = _scaled(cast(tensor1, dtype), value, dtype) * cast(tensor2, dtype)
    return (cast(x, dtype) + prod).astype(meta.dtype)


@lowers(aten.addcdiv.default)
def addcdiv(meta, x, tensor1, tensor2, value=1):
    dtype = opmath(meta.dtype)
    quot = _scaled(cast(tensor1, dtype), value, dtype) / cast(tensor2, dtype)
    return (cast(x, dtype) + quot).astype(meta.dtype)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(meta, x, end, weight):
    dtype = opmath(meta.dtype)
    x, end, w = cast(x, dtype), cast(end, dtype), cast(weight, dtype)
    diff = end - x
    return jnp.where(jnp.abs(w) < 0.5, x + w * diff, end - diff * (1 - w)).astype(meta.dtype)


@lowers(aten.clamp.default, aten.clamp.Tensor)
def clamp(meta, x, min=None, max=None):
    dtype = opmath(meta.dtype)
    x = cast(x, dtype)
    if min is not None:
        x = jnp.maximum(x, cast(min, dtype))
    if max is not None:
        x = jnp.minimum(x, cast(max, dtype))
    return jnp.broadcast_to(x, meta.shape).astype(meta.dtype)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(meta, x, min):
    return clamp(meta, x, min=min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(meta, x, max):
    return clamp(meta, x, max=max)


@lowers(aten.where.self)
def where(meta, condition, x, other):
    return jnp.where(condition.astype(jnp.bool_), cast(x, meta.dtype), cast(other, meta.dtype))


# ---------------------------------------------------------------- comparisons, logic

_COMPARISONS = {
    (aten.eq.Tensor, aten.eq.Scalar): jnp.equal,
    (aten.ne.Tensor, aten.ne.Scalar): jnp.not_equal,
    (aten.lt.Tensor, aten.lt.Scalar): jnp.less,
    (aten.le.Tensor, aten.le.Scalar): jnp.less_equal,
    (aten.gt.Tensor, aten.gt.Scalar): jnp.greater,
    (aten.ge.Tensor, aten.ge.Scalar): jnp.greater_equal,
}

for (_tensor_op, _scalar_op), _fn in _COMPARISONS.items():
    @lowers(_tensor_op)
    def _cmp_tensor(meta, a, b, _fn=_fn):
        dtype = result_type(a, b)
        return _fn(a.astype(dtype), b.astype(dtype)).astype(meta.dtype)

    @lowers(_scalar_op)
    def _cmp_scalar(meta, a, b, _fn=_fn):
        dtype = result_type(a, scalars=(b,))
        return _fn(a.astype(dtype), cast(b, dtype)).astype(meta.dtype)


_LOGICAL = {
    aten.logical_and.default: jnp.logical_and,
    aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor,
}

def _logical(fn, name):
    def lower(meta, a, b):
        return fn(a != 0, b != 0).astype(meta.dtype)
    lower.__name__ = name
    return lower


for _op, _fn in _LOGICAL.items():
    lowers(_op)(_logical(_fn, _op.__name__.split(".")[0]))
