"""Activation lowerings and their backward ops (computed in ``opmath``, cast to ``meta``)."""


import jax
import jax.numpy as jnp
import numpy as np
from torch import ops

from torchspmd.lowering._common import cast, compute_in_opmath as _f, opmath
from torchspmd.lowering._common import outputs_like_meta as _outs
from torchspmd.lowering.registry import lowers

aten = ops.aten

def _pointwise(fn):
    """An elementwise lowering ``fn(x, *rest)`` computed in opmath, cast to ``meta.dtype``."""
    def lowering(meta, *args, **kwargs):
        args = [_f(a, meta) if isinstance(a, jax.Array) else a for a in args]
        return fn(*args, **kwargs).astype(meta.dtype)
    lowering.__name__ = fn.__name__
    return lowering


def _s(value, like):
    """A Scalar argument as an array of ``like``'s dtype."""
    return cast(value, like.dtype)


@lowers(aten.relu.default)
def relu(meta, self):
    return jnp.maximum(self, jnp.zeros((), self.dtype)).astype(meta.dtype)


@lowers(aten.threshold_backward.default)
def threshold_backward(meta, grad_output, self, threshold):
    return jnp.where(self <= _s(threshold, self), 0, grad_output).astype(meta.dtype)


@lowers(aten.gelu.default)
@_pointwise
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowers(aten.gelu_backward.default)
@_pointwise
def gelu_backward(g, x, *, approximate="none"):
    return jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)[1](g)[0]


@lowers(aten.silu.default)
@_pointwise
def silu(x):
    return x * jax.nn.sigmoid(x)


@lowers(aten.silu_backward.default)
@_pointwise
def silu_backward(g, x):
    s = jax.nn.sigmoid(x)
    return g * s * (1 + x * (1 - s))


@lowers(aten.mish.default)
@_pointwise
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lowers(aten.tanh_backward.default)
@_pointwise
def tanh_backward(g, y):
    return g * (1 - y * y)


@lowers(aten.sigmoid_backward.default)
@_pointwise
def sigmoid_backward(g, y):
    return g * y * (1 - y)


@lowers(aten.hardtanh.default)
@_pointwise
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, _s(min_val, x)), _s(max_val, x))


@lowers(aten.hardtanh_backward.default)
@_pointwise
def hardtanh_backward(g, x, min_val, max_val):
    return jnp.where((x <= _s(min_val, x)) | (x >= _s(max_val, x)), 0, g)


@lowers(aten.leaky_relu.default)
@_pointwise
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * _s(negative_slope, x))


@lowers(aten.leaky_relu_backward.default)
@_pointwise
def leaky_relu_backward(g, x, negative_slope, self_is_result):
    return jnp.where(x > 0, g, g * _s(negative_slope, x))


@lowers(aten.elu.default)
@_pointwise
def elu(x, alpha=1, scale=1, input_scale=1):
    alpha, scale, input_scale = _s(alpha, x), _s(scale, x), _s(input_scale, x)
    return jnp.where(x <= 0, jnp.expm1(x * input_scale) * alpha * scale, x * scale)


@lowers(aten.celu.default)
@_pointwise
def celu(x, alpha=1):
    alpha = _s(alpha, x)
    return jnp.where(x <= 0, jnp.expm1(x / alpha) * alpha, x)


@lowers(aten.elu_backward.default)
@_pointwise
def elu_backward(g, alpha, scale, input_scale, is_result, self_or_result):
    v = self_or_result
    alpha, scale, input_scale = _s(alpha, v), _s(scale, v), _s(input_scale, v)
    if is_result:
        neg = g * input_scale * (v + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(v * input_scale)
    return jnp.where(v <= 0, neg, g * scale)


@lowers(aten.softplus.default)
@_pointwise
def softplus(x, beta=1, threshold=20):
    bx = x * _s(beta, x)
    return jnp.where(bx > _s(threshold, x), x, jnp.log1p(jnp.exp(bx)) / _s(beta, x))


@lowers(aten.softplus_backward.default)
@_pointwise
def softplus_backward(g, x, beta, threshold):
    bx = x * _s(beta, x)
    z = jnp.exp(bx)
    return jnp.where(bx > _s(threshold, x), g, g * z / (z + 1))


@lowers(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(meta, self):
    x = _f(self, meta[0])
    z = jnp.exp(-jnp.abs(x))
    return _outs(meta, (jnp.minimum(x, 0) - jnp.log1p(z), z))


@lowers(aten.log_sigmoid_backward.default)
@_pointwise
def log_sigmoid_backward(g, x, buffer):
    z = jnp.exp(-jnp.abs(x))  # recomputed: the buffer is empty on some backends
    return jnp.where(x < 0, 1 - z / (1 + z), z / (1 + z)) * g


@lowers(aten.hardswish.default)
@_pointwise
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lowers(aten.hardswish_backward.default)
@_pointwise
def hardswish_backward(g, x):
    return jnp.where(x <= -3, 0, jnp.where(x < 3, g * (x / 3 + 0.5), g))


@lowers(aten.hardsigmoid.default)
@_pointwise
def hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


@lowers(aten.hardsigmoid_backward.default)
@_pointwise
def hardsigmoid_backward(g, x):
    return jnp.where((x > -3) & (x < 3), g * np.float32(1 / 6).astype(g.dtype), 0)  # aten's float32 1/6


@lowers(aten._prelu_kernel.default)
@_pointwise
def _prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lowers(aten._prelu_kernel_backward.default)
def _prelu_kernel_backward(meta, grad_output, self, weight):
    g, x, w = (_f(t, meta[0]) for t in (grad_output, self, weight))
    return _outs(meta, (jnp.where(x > 0, g, w * g), jnp.where(x > 0, 0, x * g)))


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(meta, grad_output, mask, scale):
    acc = opmath(meta.dtype)
    return (grad_output.astype(acc) * mask.astype(acc) * scale).astype(meta.dtype)


@lowers(aten.hardshrink_backward.default)
@_pointwise
def hardshrink_backward(g, x, lambd):
    lambd = _s(lambd, x)
    return jnp.where((x >= -lambd) & (x <= lambd), 0, g)


@lowers(aten.softshrink_backward.default)
@_pointwise
def softshrink_backward(g, x, lambd):
    lambd = _s(lambd, x)
    return jnp.where((x >= -lambd) & (x <= lambd), 0, g)


@lowers(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(meta, x, noise, lower=0.125, upper=1.0 / 3.0, training=False,
                                generator=None, *, key):
    """Randomized leaky ReLU; ``noise_out`` holds each element's slope (1 where x > 0).

    In eval the slope is ``(lower + upper) / 2`` everywhere and ``noise`` is unchanged.
    """
    out_meta, noise_meta = meta
    xf = _f(x, out_meta)
    if not training:
        slope = (_s(lower, xf) + _s(upper, xf)) / 2
        return jnp.where(xf >= 0, xf, xf * slope).astype(out_meta.dtype), noise
    slopes = jax.random.uniform(key, x.shape, xf.dtype, _s(lower, xf), _s(upper, xf))
    slope = jnp.where(xf <= 0, slopes, jnp.ones((), xf.dtype))
    return (xf * slope).astype(out_meta.dtype), slope.astype(noise_meta.dtype)
