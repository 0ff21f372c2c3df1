"""Normalization lowerings: layer, group and batch norm, forward and backward.

Batch norm in training mutates its running statistics although its schema does not say so;
the recorder records ``_native_batch_norm_legit_functional`` and assigns outputs 3 and 4
(``device/dispatch.py``). Everything computes in ``opmath`` and casts to ``meta``.
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import centered_sums, reduced_count
from torchspmd.lowering._common import compute_in_opmath as _f, opmath
from torchspmd.lowering._common import outputs_like_meta as _outs
from torchspmd.lowering.registry import lowers

aten = ops.aten

def moments(x, axes):
    """Mean and biased variance of ``x`` over ``axes`` (kept), in the corrected two-pass
    form (``_common.centered_sums``: data far from zero, mean 1e4 and std 0.1 in float32,
    had its variance 1e-4 off, relatively, and its normalized values shifted by it)."""
    axes = tuple(a % x.ndim for a in (axes if isinstance(axes, tuple) else (axes,)))
    mean, s = centered_sums(x, axes)
    return mean, jnp.expand_dims(s / reduced_count(x.shape, axes), axes)


def _normalize_backward(g, xhat, rstd, axes):
    """d(input) of ``xhat = (x - mean(x)) * rstd`` over ``axes`` given d(xhat) = ``g``."""
    return rstd * (g - jnp.mean(g, axes, keepdims=True) - xhat * jnp.mean(g * xhat, axes, keepdims=True))


@lowers(aten.native_layer_norm.default)
def native_layer_norm(meta, input, normalized_shape, weight, bias, eps):
    x = _f(input, meta[0])
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean, var = moments(x, axes)
    rstd = jax.lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    out = out if weight is None else out * _f(weight, meta[0])
    out = out if bias is None else out + _f(bias, meta[0])
    return _outs(meta, (out, mean, rstd))


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(meta, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    acc = opmath(input.dtype)
    x, g, mean, rstd = (t.astype(acc) for t in (input, grad_out, mean, rstd))
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch = tuple(range(x.ndim - len(normalized_shape)))
    xhat = (x - mean) * rstd
    gi = _normalize_backward(g if weight is None else g * weight.astype(acc), xhat, rstd, axes)
    return _outs(meta, (gi, jnp.sum(g * xhat, batch), jnp.sum(g, batch)))


def _grouped(x, n, c, group):
    return x.reshape(n, group, c // group, -1)


@lowers(aten.native_group_norm.default)
def native_group_norm(meta, input, weight, bias, N, C, HxW, group, eps):
    x = _grouped(_f(input, meta[0]), N, C, group)
    mean, var = moments(x, (2, 3))
    rstd = jax.lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    out = out if weight is None else out * _grouped(_f(weight, meta[0]), 1, C, group)
    out = out if bias is None else out + _grouped(_f(bias, meta[0]), 1, C, group)
    return _outs(meta, (out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)))


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(meta, grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    acc = opmath(input.dtype)
    x, g = _grouped(input.astype(acc), N, C, group), _grouped(grad_out.astype(acc), N, C, group)
    mean, rstd = mean.astype(acc)[:, :, None, None], rstd.astype(acc)[:, :, None, None]
    xhat = (x - mean) * rstd
    gx = g if weight is None else g * _grouped(weight.astype(acc), 1, C, group)
    gi = _normalize_backward(gx, xhat, rstd, (2, 3)).reshape(input.shape)
    gw, gb = jnp.sum(g * xhat, (0, 3)).reshape(C), jnp.sum(g, (0, 3)).reshape(C)
    return _outs(meta, (gi, gw, gb))


def _bn_shape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, acc):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) in ``acc``."""
    x = input.astype(acc)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _bn_shape(x)
    new_rm, new_rv = running_mean, running_var
    if training:
        mean, var = (m.reshape(-1) for m in moments(x, axes))
        invstd = jax.lax.rsqrt(var + eps)
        n = reduced_count(x.shape, axes)
        if running_mean is not None:
            new_rm = (1 - momentum) * running_mean.astype(acc) + momentum * mean
        if running_var is not None:
            new_rv = (1 - momentum) * running_var.astype(acc) + momentum * var * (n / max(n - 1, 1))
    else:
        mean, invstd = running_mean.astype(acc), jax.lax.rsqrt(running_var.astype(acc) + eps)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    out = out if weight is None else out * weight.astype(acc).reshape(shape)
    out = out if bias is None else out + bias.astype(acc).reshape(shape)
    return out, mean, invstd, new_rm, new_rv


@lowers(aten.native_batch_norm.default)
def native_batch_norm(meta, input, weight, bias, running_mean, running_var, training, momentum, eps):
    """The pure part only: see the module docstring for the running-stat update."""
    return _outs(meta, _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                      opmath(meta[0].dtype))[:3])


@lowers(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(meta, input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _outs(meta, _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                      opmath(meta[0].dtype)))


@lowers(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(meta, input, weight, bias, training, momentum, eps):
    return _outs(meta, _batch_norm(input, weight, bias, None, None, True, momentum, eps, opmath(meta[0].dtype))[:3])


@lowers(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(meta, input, weight, bias, running_mean, running_var, momentum, eps):
    return _outs(meta, _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps,
                                      opmath(meta[0].dtype))[:3])


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(meta, grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    acc = opmath(input.dtype)
    x, g = input.astype(acc), grad_out.astype(acc)
    axes, shape = (0,) + tuple(range(2, x.ndim)), _bn_shape(x)
    if train:
        mean, invstd = save_mean.astype(acc), save_invstd.astype(acc)
    else:
        mean, invstd = running_mean.astype(acc), jax.lax.rsqrt(running_var.astype(acc) + eps)
    mean, invstd = mean.reshape(shape), invstd.reshape(shape)
    xhat = (x - mean) * invstd
    gx = g if weight is None else g * weight.astype(acc).reshape(shape)
    gi = _normalize_backward(gx, xhat, invstd, axes) if train else gx * invstd
    return _outs(meta, (gi, jnp.sum(g * xhat, axes), jnp.sum(g, axes)))


@lowers(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(meta, grad_w, saved_v, saved_g, saved_norms, dim):
    """Gradients of ``w = v * g / ||v||`` (norm over every dim but ``dim``): d(v), d(g).

    ``saved_norms`` has ``g``'s keepdim shape, so it broadcasts against ``v``.
    """
    acc = opmath(saved_v.dtype)
    gw, v, g, norms = (t.astype(acc) for t in (grad_w, saved_v, saved_g, saved_norms))
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
    per_dim = jnp.sum(gw * v, axes, keepdims=True)
    grad_v = (g / norms) * (gw - v * (per_dim / (norms * norms)))
    return _outs(meta, (grad_v, per_dim / norms))
