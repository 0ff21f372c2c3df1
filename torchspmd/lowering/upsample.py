"""Backward ops of ``F.interpolate`` (nearest, nearest-exact, linear, bilinear, trilinear,
bicubic): the adjoint of the forward, which is linear in its input.

The forward ops reach the device through PyTorch's decompositions; their gradients are
lowered here as ``jax.vjp`` of the same resampling, written as one gather-and-weigh per
spatial axis (every mode is separable). Source positions follow PyTorch's kernels
(``area_pixel_compute_source_index``, ``nearest_idx``), computed in float32 as they are.
"""

import jax
import jax.numpy as jnp
import numpy as np
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.registry import lowers

aten = ops.aten

_CUBIC_A = -0.75


def _scale(n_in: int, n_out: int, align_corners: bool, scale) -> np.float32:
    """PyTorch's ``area_pixel_compute_scale``: input step per output step."""
    if align_corners:
        return np.float32((n_in - 1) / (n_out - 1) if n_out > 1 else 0)
    return np.float32(1.0 / scale if scale is not None and scale > 0 else n_in / n_out)


def _nearest(n_in, n_out, scale, exact: bool):
    """(indices (out, 1), weights (out, 1)) of nearest / nearest-exact resampling."""
    dst = np.arange(n_out, dtype=np.float32)
    s = np.float32(1.0 / scale if scale is not None and scale > 0 else n_in / n_out)
    if exact:
        src = np.floor((dst + np.float32(0.5)) * s)
    elif n_out == n_in:
        src = dst
    elif n_out == 2 * n_in:
        src = np.floor(dst / 2)
    else:
        src = np.floor(dst * s)
    index = np.minimum(src.astype(np.int64), n_in - 1)
    return index[:, None], np.ones((n_out, 1), np.float32)


def _linear(n_in, n_out, align_corners, scale):
    s = _scale(n_in, n_out, align_corners, scale)
    dst = np.arange(n_out, dtype=np.float32)
    src = s * dst if align_corners else np.maximum(s * (dst + np.float32(0.5)) - np.float32(0.5), 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = (src - i0).astype(np.float32)
    return np.stack([i0, i1], 1), np.stack([1 - w1, w1], 1)


def _cubic_weights(t):
    a = np.float32(_CUBIC_A)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1)


def _cubic(n_in, n_out, align_corners, scale):
    s = _scale(n_in, n_out, align_corners, scale)
    dst = np.arange(n_out, dtype=np.float32)
    src = s * dst if align_corners else s * (dst + np.float32(0.5)) - np.float32(0.5)
    i0 = np.floor(src).astype(np.int64)
    t = (src - i0).astype(np.float32)
    index = np.clip(i0[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
    return index, _cubic_weights(t)


def _resample(x, taps):
    """Resample the trailing ``len(taps)`` axes of ``x``, each by (indices, weights)."""
    first = x.ndim - len(taps)
    for axis, (index, weight) in enumerate(taps, start=first):
        picked = jnp.take(x, jnp.asarray(index.reshape(-1)), axis=axis)
        picked = picked.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1:])
        w = jnp.asarray(weight, x.dtype).reshape(index.shape + (1,) * (x.ndim - axis - 1))
        x = jnp.sum(picked * w, axis=axis + 1)
    return x


def _backward(meta, grad_output, input_size, taps):
    """The gradient of resampling ``taps`` at an input of ``input_size``."""
    acc = opmath(meta.dtype)
    zeros = jnp.zeros(tuple(input_size), acc)
    _, vjp = jax.vjp(lambda x: _resample(x, taps), zeros)
    return vjp(grad_output.astype(acc))[0].astype(meta.dtype)


def _check_sizes(op: str, output_size, input_size, spatial: int) -> None:
    if len(output_size) != spatial or len(input_size) != spatial + 2:
        raise ValueError(f"torchspmd: {op} expects {spatial} output sizes and an input size "
                         f"of {spatial + 2} dims, got {list(output_size)} and {list(input_size)}")
    if any(n <= 0 for n in output_size) or any(n <= 0 for n in input_size[2:]):
        raise ValueError(f"torchspmd: {op}: input and output sizes must be positive, got "
                         f"{list(input_size)} -> {list(output_size)}")


def _register_nearest(op, spatial: int, exact: bool):
    def lowering(meta, grad_output, output_size, input_size, *scales):
        _check_sizes(op._schema.name, output_size, input_size, spatial)
        scales = (list(scales) + [None] * spatial)[:spatial]
        taps = [_nearest(n, o, s, exact) for n, o, s in zip(input_size[2:], output_size, scales)]
        return _backward(meta, grad_output, input_size, taps)

    lowering.__name__ = op._schema.name.split("::")[-1]
    lowers(op)(lowering)


def _register_interpolating(op, spatial: int, taps_of):
    def lowering(meta, grad_output, output_size, input_size, align_corners, *scales):
        _check_sizes(op._schema.name, output_size, input_size, spatial)
        scales = (list(scales) + [None] * spatial)[:spatial]
        taps = [taps_of(n, o, align_corners, s)
                for n, o, s in zip(input_size[2:], output_size, scales)]
        return _backward(meta, grad_output, input_size, taps)

    lowering.__name__ = op._schema.name.split("::")[-1]
    lowers(op)(lowering)


for _spatial in (1, 2, 3):
    _register_nearest(getattr(aten, f"upsample_nearest{_spatial}d_backward").default, _spatial, False)
    _register_nearest(getattr(aten, f"_upsample_nearest_exact{_spatial}d_backward").default,
                      _spatial, True)
_register_interpolating(aten.upsample_linear1d_backward.default, 1, _linear)
_register_interpolating(aten.upsample_bilinear2d_backward.default, 2, _linear)
_register_interpolating(aten.upsample_trilinear3d_backward.default, 3, _linear)
_register_interpolating(aten.upsample_bicubic2d_backward.default, 2, _cubic)
