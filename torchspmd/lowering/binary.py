"""Elementwise aten ops of two or more tensors -> JAX: arithmetic, comparisons, logic.

Every lowering computes in the operands' promoted type (``opmath`` for half types, as
PyTorch's CPU kernels do) with its inputs cast explicitly, and returns ``meta.dtype``.
Ops of the same shape of code are registered from tables.
"""

import jax.numpy as jnp
import torch
from jax import lax

from torchspmd.lowering._common import cast, is_floating, opmath, result_type
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _is_one(v) -> bool:
    """``v`` is the Python number 1 (a static default, never a traced value)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1


def _scaled(y, alpha, dtype):
    return y if _is_one(alpha) else y * cast(alpha, dtype)


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


def _power(a, b):
    """``a ** b``; for integers PyTorch's rule for negative exponents: 1 ** b is 1,
    (-1) ** b is +-1, anything else 0 (``jnp.power`` gives garbage there)."""
    if not jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.power(a, b)
    negative = b < 0
    reciprocal = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(b % 2 != 0, -1, 1), 0))
    return jnp.where(negative, reciprocal.astype(a.dtype), jnp.power(a, jnp.where(negative, 0, b)))


def _xlogy(log):
    def fn(x, y):
        return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * log(y)))
    return fn


# (self, other) -> result, both cast to opmath(meta.dtype).
_BINARY = {
    (aten.mul.Tensor, aten.mul.Scalar): jnp.multiply,
    (aten.div.Tensor, aten.div.Scalar): jnp.true_divide,
    (aten.floor_divide.default, aten.floor_divide.Scalar): _floor_divide,
    (aten.pow.Tensor_Tensor, aten.pow.Scalar): _power,
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
    (aten.logaddexp2.default,): jnp.logaddexp2,
    (aten.ldexp.Tensor,): lambda x, e: x * jnp.exp2(e),
    (aten.gcd.default,): jnp.gcd,
    (aten.lcm.default,): jnp.lcm,
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
    if isinstance(exponent, float) and float(exponent) in (0.5, -0.5) and is_floating(dtype):
        # Static (``lazy/schema.SPECIAL_EXPONENTS``): a square root, as PyTorch computes it
        # (``pow(-inf, 0.5)`` is nan there, not inf; ``pow(-0.0, 0.5)`` is -0.0).
        root = lax.sqrt(x.astype(dtype)) if float(exponent) > 0 else lax.rsqrt(x.astype(dtype))
        return root.astype(meta.dtype)
    return _power(x.astype(dtype), cast(exponent, dtype)).astype(meta.dtype)


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
