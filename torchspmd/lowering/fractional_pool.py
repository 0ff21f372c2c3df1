"""Fractional max pooling (2-d and 3-d) and its backward ops.

Window starts come from ``random_samples`` (one number in [0, 1) per sample, plane and
spatial dim), as PyTorch's ``generate_intervals`` computes them in the samples' dtype:
``start[i] = int((i + u) * alpha) - int(u * alpha)`` with ``alpha = (in - k) / (out - 1)``,
the last window ending at the input's end. The starts are data, the window sizes static,
so the result is a gather of static shape. Sample dims map to spatial dims as on CPU:
(W, H) for 2-d, (T, H, W) for 3-d.
"""

import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.conv import _scatter_to_planes, _tup
from torchspmd.lowering.pool3d import _scatter_to_volumes
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten


def _starts(u, n_in: int, n_out: int, k: int):
    """Window starts (..., n_out) from samples ``u`` (...)."""
    if n_out == 1:
        return jnp.full(u.shape + (1,), n_in - k, jnp.int64)
    alpha = (jnp.asarray(n_in - k, u.dtype) / jnp.asarray(n_out - 1, u.dtype))
    i = jnp.arange(n_out - 1, dtype=u.dtype)
    starts = (jnp.floor((i + u[..., None]) * alpha) - jnp.floor(u * alpha)[..., None]).astype(jnp.int64)
    last = jnp.full(u.shape + (1,), n_in - k, jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(x, kernel, out_size, samples, sample_dims):
    """(max, flat index) over windows of ``kernel`` at starts drawn from ``samples``."""
    spatial = len(kernel)
    batched = x.ndim == spatial + 2
    xb = x if batched else x[None]
    n, c = xb.shape[:2]
    size = xb.shape[2:]
    samples = samples.reshape(n, c, spatial)
    # Per spatial dim: positions (N, C, O, K) of each window's elements.
    positions = []
    for d in range(spatial):
        starts = _starts(samples[:, :, sample_dims[d]], size[d], out_size[d], kernel[d])
        positions.append(starts[..., None] + jnp.arange(kernel[d]))
    vals = xb
    for d, pos in enumerate(positions):  # gather dim d: (…, O_d * K_d, …)
        axis = 2 + d
        shape = [n, c] + [1] * spatial
        shape[axis] = -1
        idx = pos.reshape(n, c, -1).reshape(shape)
        vals = jnp.take_along_axis(vals, jnp.broadcast_to(idx, vals.shape[:axis] + idx.shape[axis:axis + 1]
                                                          + vals.shape[axis + 1:]), axis=axis)
    split = [n, c] + [v for d in range(spatial) for v in (out_size[d], kernel[d])]
    vals = vals.reshape(split)
    order = [0, 1] + [2 + 2 * d for d in range(spatial)] + [3 + 2 * d for d in range(spatial)]
    vals = jnp.transpose(vals, order).reshape(n, c, *out_size, -1)
    # The flat input index of each window element, in the same layout.
    flat = jnp.zeros((n, c) + tuple(out_size) + tuple(kernel), jnp.int64)
    stride = 1
    for d in reversed(range(spatial)):
        shape = [n, c] + [1] * spatial + [1] * spatial
        shape[2 + d], shape[2 + spatial + d] = out_size[d], kernel[d]
        flat = flat + positions[d].reshape(shape) * stride
        stride *= size[d]
    flat = flat.reshape(n, c, *out_size, -1)
    arg = jnp.argmax(vals, axis=-1)[..., None]
    out = jnp.take_along_axis(vals, arg, axis=-1)[..., 0]
    index = jnp.take_along_axis(flat, arg, axis=-1)[..., 0]
    return (out, index) if batched else (out[0], index[0])


@lowers(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(meta, self, kernel_size, output_size, random_samples):
    out, index = _fractional_max_pool(self, _tup(kernel_size, 2), _tup(output_size, 2),
                                      random_samples, sample_dims=(1, 0))
    return out.astype(meta[0].dtype), index.astype(meta[1].dtype)


@lowers(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(meta, self, kernel_size, output_size, random_samples):
    out, index = _fractional_max_pool(self, _tup(kernel_size, 3), _tup(output_size, 3),
                                      random_samples, sample_dims=(0, 1, 2))
    return out.astype(meta[0].dtype), index.astype(meta[1].dtype)


@lowers(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(meta, grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_planes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)


@infers(aten.fractional_max_pool3d_backward.default)
def _like_self(grad_output, self, *args):
    """PyTorch has no meta kernel for it: the gradient has the input's shape."""
    return self.new_empty(self.shape)


@lowers(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(meta, grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_volumes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)

