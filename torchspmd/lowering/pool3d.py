"""3-d pooling lowerings (average, adaptive average, adaptive max) and their backward ops.

They follow the 2-d ones of ``conv.py`` (same window arithmetic, PyTorch's output sizes,
``count_include_pad`` and ``divisor_override``), over the last three dims. Max pooling's
backward scatters into the argmax ``indices`` PyTorch saved (flat per-volume positions,
``(d * H + h) * W + w``). ``max_pool3d_with_indices`` is lowered here too: PyTorch 2.13
decomposes it before it reaches the device, PyTorch 2.11 does not.
"""

import jax
import jax.numpy as jnp
import numpy as np
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.conv import (_adaptive_matrix, _adaptive_windows, _avg_pool, _tup,
                                     _windows)
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _avg_pool3d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 3)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(meta, self, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    out = _avg_pool3d(self.astype(opmath(meta.dtype)), kernel_size, stride, padding, ceil_mode,
                      count_include_pad, divisor_override)
    if np.issubdtype(meta.dtype, np.integer):  # integer averages truncate, as on CPU
        out = jnp.trunc(out)
    return out.astype(meta.dtype)


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(meta, grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    acc = opmath(meta.dtype)
    _, vjp = jax.vjp(lambda x: _avg_pool3d(x, kernel_size, stride, padding, ceil_mode,
                                           count_include_pad, divisor_override), self.astype(acc))
    return vjp(grad_output.astype(acc))[0].astype(meta.dtype)


def _adaptive_matrices(size, out, dtype):
    return [_adaptive_matrix(n, o).astype(dtype) for n, o in zip(size, out)]


@lowers(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(meta, self, output_size):
    acc = opmath(meta.dtype)
    md, mh, mw = _adaptive_matrices(self.shape[-3:], _tup(output_size, 3), acc)
    out = jnp.einsum("...dhw,ad,bh,cw->...abc", self.astype(acc), md, mh, mw,
                     precision=jax.lax.Precision.HIGHEST)
    return out.astype(meta.dtype)


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(meta, grad_output, self):
    acc = opmath(meta.dtype)
    md, mh, mw = _adaptive_matrices(self.shape[-3:], grad_output.shape[-3:], acc)
    out = jnp.einsum("...abc,ad,bh,cw->...dhw", grad_output.astype(acc), md, mh, mw,
                     precision=jax.lax.Precision.HIGHEST)
    return out.astype(meta.dtype)


def _max_over_windows(x, windows):
    """Max over 3-d windows (per axis: positions (out, k), valid (out, k)) and the flat
    per-volume index of the first maximum."""
    (a, av), (b, bv), (c, cv) = windows
    h, w = x.shape[-2:]
    lead = x.ndim - 3
    vals = x[..., a, :, :][..., b, :][..., c]  # (..., OD, KD, OH, KH, OW, KW)
    order = tuple(range(lead)) + tuple(lead + i for i in (0, 2, 4, 1, 3, 5))
    vals = jnp.transpose(vals, order)  # (..., OD, OH, OW, KD, KH, KW)
    valid = (av[:, None, None, :, None, None] & bv[None, :, None, None, :, None]
             & cv[None, None, :, None, None, :])
    flat = (a[:, None, None, :, None, None] * (h * w) + b[None, :, None, None, :, None] * w
            + c[None, None, :, None, None, :])
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    vals = jnp.where(valid, vals, jnp.asarray(lowest, x.dtype)).reshape(vals.shape[:-3] + (-1,))
    arg = jnp.argmax(vals, axis=-1)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(flat.reshape(flat.shape[:3] + (-1,)), vals.shape)
    return out, jnp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]


@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(meta, self, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    k, p, d = _tup(kernel_size, 3), _tup(padding, 3), _tup(dilation, 3)
    s = _tup(stride, 3) if stride else k  # an empty stride means the kernel size
    windows = [_windows(n, *args, ceil_mode) for n, *args in zip(self.shape[-3:], k, s, p, d)]
    out, index = _max_over_windows(self, windows)
    return out.astype(meta[0].dtype), index.astype(meta[1].dtype)


@lowers(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(meta, self, output_size):
    windows = [_adaptive_windows(n, o) for n, o in zip(self.shape[-3:], _tup(output_size, 3))]
    out, index = _max_over_windows(self, windows)
    return out.astype(meta[0].dtype), index.astype(meta[1].dtype)


def _scatter_to_volumes(grad_output, self, indices, dtype):
    """Sum each gradient into its input position (flat per-volume index)."""
    volume = int(np.prod(self.shape[-3:], dtype=np.int64))
    b = int(np.prod(self.shape[:-3], dtype=np.int64))
    g = grad_output.astype(dtype).reshape(b, -1)
    out = jnp.zeros((b, volume), dtype).at[jnp.arange(b)[:, None], indices.reshape(b, -1)].add(g)
    return out.reshape(self.shape)


@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(meta, grad_output, self, kernel_size, stride, padding,
                                     dilation, ceil_mode, indices):
    return _scatter_to_volumes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)


@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(meta, grad_output, self, indices):
    return _scatter_to_volumes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)
