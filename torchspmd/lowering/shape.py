"""Lowerings of view / shape / layout ops, and of the ``*_scatter`` inverses of views.

View ops are lowered as their functional value (a new array): the recorder replays views
on top of their base and writes a mutated view back with the scatter ops at the bottom of
this module. The ``*_copy`` variants (which functionalization may emit) share the
lowering of their view.

``as_strided`` / ``as_strided_scatter`` support the views that are plain views of a
*contiguous* tensor: the flat positions ``offset + sum_d i_d * stride_d`` are computed at
trace time (sizes and strides are static) and gathered from / scattered into the
flattened input. ``storage_offset=None`` means 0: a lowering sees values, not storages, so
the input is taken to be its own contiguous storage.
"""

import numpy as np
import jax.numpy as jnp
from jax import lax
from torch import ops

from torchspmd.lowering._common import cast, wrap_dim
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _slice_start(size: int, start) -> int:
    """PyTorch's clamping of ``slice``'s start (``None`` and negatives included)."""
    start = 0 if start is None else start
    start = start + size if start < 0 else start
    return min(max(start, 0), size)


def _slice_index(ndim: int, dim: int, size: int, start, step: int, length: int) -> tuple:
    """An index tuple selecting ``length`` elements from ``start`` by ``step`` along ``dim``."""
    s = _slice_start(size, start)
    # One element needs no stride, and XLA's partitioner reads the wrong element for a
    # one-element strided slice of a sharded dim (`x[2::3]` of x = [0, 10, 20] sharded
    # 3 ways gives [0]; plain JAX 0.10.2 reproduces it).
    step = 1 if length <= 1 else step
    return (slice(None),) * dim + (slice(s, s + (length - 1) * step + 1 if length else s, step),)


# ---------------------------------------------------------------- reshapes and aliases
# Every op here is "the same elements in row-major order, in meta's shape".
@lowers(aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
        aten.view_copy.default, aten._reshape_copy.default,
        aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
        aten.squeeze_copy.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
        aten.unsqueeze.default, aten.unsqueeze_copy.default)
def reshape(meta, x, *_args):
    return jnp.reshape(x, meta.shape)


@lowers(aten.alias.default, aten.alias_copy.default, aten.detach.default, aten.detach_copy.default)
def identity(meta, x):
    return x


@lowers(aten.expand.default, aten.expand_copy.default)
def expand(meta, x, size, *, implicit=False):
    return jnp.broadcast_to(x, meta.shape)


@lowers(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(meta, x, dtype):
    """Bitcast; a different item size changes the last dim, as in PyTorch."""
    src = jnp.uint8 if x.dtype == jnp.bool_ else x.dtype
    dst = jnp.uint8 if meta.dtype == jnp.bool_ else meta.dtype
    x = x.astype(src)
    ratio = jnp.dtype(dst).itemsize // jnp.dtype(src).itemsize
    if ratio > 1:  # several input items make one output item
        x = x.reshape(*x.shape[:-1], -1, ratio)
    out = lax.bitcast_convert_type(x, dst).reshape(meta.shape)
    return out.astype(meta.dtype)


@lowers(aten.permute.default, aten.permute_copy.default)
def permute(meta, x, dims):
    return jnp.transpose(x, [wrap_dim(d, x.ndim) for d in dims])


@lowers(aten.transpose.int, aten.transpose_copy.int)
def transpose(meta, x, dim0, dim1):
    return x if x.ndim < 2 else jnp.swapaxes(x, dim0, dim1)


@lowers(aten.t.default, aten.t_copy.default)
def t(meta, x):
    return x.T


@lowers(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(meta, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1).astype(meta.dtype)


@lowers(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(meta, x):
    return lax.complex(x[..., 0], x[..., 1]).astype(meta.dtype)


# ---------------------------------------------------------------- joining and splitting
@lowers(aten.cat.default)
def cat(meta, tensors, dim=0):
    # PyTorch skips 1-D empty tensors whatever the other inputs' rank (legacy behaviour).
    parts = [t.astype(meta.dtype) for t in tensors if t.shape != (0,)]
    if not parts:
        return jnp.zeros(meta.shape, meta.dtype)
    dim = wrap_dim(dim, len(meta.shape))
    if len({t.shape[dim] for t in parts}) == 1:
        return jnp.concatenate(parts, axis=dim)
    # Pieces of unequal sizes are written one by one into zeros: XLA's partitioner
    # (Shardy and GSPMD, jax 0.10.2) miscompiles a scatter (`index_put`, `index_add`)
    # into an unevenly sized concatenate of sharded pieces; a chain of
    # dynamic-update-slices is partitioned correctly. Equal pieces keep the concatenate.
    out, start = jnp.zeros(meta.shape, meta.dtype), 0
    for t in parts:
        out = _write_block(meta, out, t, dim, start)
        start += t.shape[dim]
    return out


@lowers(aten.stack.default)
def stack(meta, tensors, dim=0):
    return jnp.stack([t.astype(meta.dtype) for t in tensors], axis=wrap_dim(dim, len(meta.shape)))


@lowers(aten.block_diag.default)
def block_diag(meta, tensors):
    out, r, c = jnp.zeros(meta.shape, meta.dtype), 0, 0
    for t in tensors:
        t = t.reshape((1,) * (2 - t.ndim) + t.shape).astype(meta.dtype)
        out = out.at[r:r + t.shape[0], c:c + t.shape[1]].set(t)
        r, c = r + t.shape[0], c + t.shape[1]
    return out


# split(size), split_with_sizes(sizes) and their unsafe_/_copy twins: meta has the pieces.
@lowers(aten.split.Tensor, aten.split_with_sizes.default, aten.unsafe_split.Tensor,
        aten.unsafe_split_with_sizes.default, aten.split_copy.Tensor, aten.split_with_sizes_copy.default)
def split(meta, x, _sizes, dim=0):
    dim, start, outs = wrap_dim(dim, x.ndim), 0, []
    for m in meta:
        outs.append(lax.slice_in_dim(x, start, start + m.shape[dim], axis=dim))
        start += m.shape[dim]
    return outs


@lowers(aten.unbind.int, aten.unbind_copy.int)
def unbind(meta, x, dim=0):
    dim = wrap_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


# ---------------------------------------------------------------- selecting
@lowers(aten.select.int, aten.select_copy.int)
def select(meta, x, dim, index):
    dim = wrap_dim(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[dim], dim, keepdims=False)


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(meta, x, dim=0, start=None, end=None, step=1):
    dim = wrap_dim(dim, x.ndim)
    return x[_slice_index(x.ndim, dim, x.shape[dim], start, step, meta.shape[dim])]


@lowers(aten.narrow_copy.default)
def narrow_copy(meta, x, dim, start, length):
    dim = wrap_dim(dim, x.ndim)
    return x[_slice_index(x.ndim, dim, x.shape[dim], start, 1, length)]


@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(meta, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim))


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(meta, x, size, stride, storage_offset=None):
    return x.reshape(-1)[_strided_positions(size, stride, storage_offset)]


def _strided_positions(size, stride, storage_offset) -> np.ndarray:
    """Flat positions of an ``as_strided`` view of a contiguous tensor (static, trace time)."""
    pos = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        pos += (np.arange(n, dtype=np.int64) * s).reshape((-1,) + (1,) * (len(size) - d - 1))
    return pos


@lowers(aten.unfold.default, aten.unfold_copy.default)
def unfold(meta, x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(meta.shape)
    d = wrap_dim(dimension, x.ndim)
    windows = np.arange(meta.shape[d])[:, None] * step + np.arange(size)
    return jnp.moveaxis(jnp.take(x, windows, axis=d), d + 1, -1)


# ---------------------------------------------------------------- rearranging
@lowers(aten.flip.default)
def flip(meta, x, dims):
    return jnp.flip(x, tuple(wrap_dim(d, x.ndim) for d in dims)) if x.ndim else x


@lowers(aten.roll.default)
def roll(meta, x, shifts, dims=()):
    return jnp.roll(x, tuple(shifts), tuple(dims)) if dims else jnp.roll(x, shifts[0])


@lowers(aten.rot90.default)
def rot90(meta, x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=tuple(dims))


@lowers(aten.repeat.default)
def repeat(meta, x, repeats):
    return jnp.tile(x, tuple(repeats)).reshape(meta.shape)


@lowers(aten.tril.default)
def tril(meta, x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowers(aten.triu.default)
def triu(meta, x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(meta, x, pad, value=0):
    """``pad`` pairs run from the last dim backwards; negative pads crop (``lax.pad`` does both)."""
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x.astype(meta.dtype), cast(value, meta.dtype), config)


def _diag_positions(n: int, offset: int):
    i = np.arange(n)
    return i + max(-offset, 0), i + max(offset, 0)


@lowers(aten.diag_embed.default)
def diag_embed(meta, x, offset=0, dim1=-2, dim2=-1):
    ndim = len(meta.shape)
    d1, d2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    n = meta.shape[d1]
    rows, cols = _diag_positions(x.shape[-1], offset)
    out = jnp.zeros(x.shape[:-1] + (n, n), meta.dtype).at[..., rows, cols].set(x.astype(meta.dtype))
    return jnp.moveaxis(out, (-2, -1), (d1, d2))


# ---------------------------------------------------------------- scatter inverses of views
# A write of one block is a dynamic-update-slice, not a scatter (`.at[...].set`): XLA's
# partitioner miscompiles the scatter when it propagates an uneven sharding onto its
# operand (`cat([x, y, x])` of an evenly sharded x: the write lands in the wrong element;
# plain JAX 0.10.2 reproduces it), and XLA updates a slice in place either way.
def _write_block(meta, x, src, dim: int, start: int):
    starts = [0] * x.ndim
    starts[dim] = start
    return lax.dynamic_update_slice(x.astype(meta.dtype), src.astype(meta.dtype), starts)


@lowers(aten.slice_scatter.default)
def slice_scatter(meta, x, src, dim=0, start=None, end=None, step=1):
    dim = wrap_dim(dim, x.ndim)
    if step == 1 and src.shape[dim] > 0:
        return _write_block(meta, x, src, dim, _slice_start(x.shape[dim], start))
    idx = _slice_index(x.ndim, dim, x.shape[dim], start, step, src.shape[dim])
    return x.astype(meta.dtype).at[idx].set(src.astype(meta.dtype))


@lowers(aten.select_scatter.default)
def select_scatter(meta, x, src, dim, index):
    dim = wrap_dim(dim, x.ndim)
    return _write_block(meta, x, jnp.expand_dims(src, dim), dim, index % x.shape[dim])


@lowers(aten.diagonal_scatter.default)
def diagonal_scatter(meta, x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim)
    rows, cols = _diag_positions(src.shape[-1], offset)
    y = jnp.moveaxis(x.astype(meta.dtype), (d1, d2), (-2, -1))
    y = y.at[..., rows, cols].set(src.astype(meta.dtype))
    return jnp.moveaxis(y, (-2, -1), (d1, d2))


@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(meta, x, src, size, stride, storage_offset=None):
    flat = x.astype(meta.dtype).reshape(-1)
    flat = flat.at[_strided_positions(size, stride, storage_offset)].set(src.astype(meta.dtype))
    return flat.reshape(meta.shape)


# Backward ops of views: the scatter of the gradient into zeros of the input's shape.
@lowers(aten.select_backward.default)
def select_backward(meta, grad, input_sizes, dim, index):
    return select_scatter(meta, jnp.zeros(meta.shape, meta.dtype), grad, dim, index)


@lowers(aten.slice_backward.default)
def slice_backward(meta, grad, input_sizes, dim, start, end, step):
    return slice_scatter(meta, jnp.zeros(meta.shape, meta.dtype), grad, dim, start, end, step)


@lowers(aten.diagonal_backward.default)
def diagonal_backward(meta, grad, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(meta, jnp.zeros(meta.shape, meta.dtype), grad, offset, dim1, dim2)


@lowers(aten.unfold_backward.default)
def unfold_backward(meta, grad, input_sizes, dim, size, step):
    if not input_sizes:
        return grad.reshape(meta.shape).astype(meta.dtype)
    d = wrap_dim(dim, len(input_sizes))
    n = grad.shape[d]
    windows = np.arange(n)[:, None] * step + np.arange(size)
    g = jnp.moveaxis(jnp.moveaxis(grad, -1, d + 1), (d, d + 1), (0, 1)).astype(meta.dtype)
    out = jnp.zeros((meta.shape[d],) + meta.shape[:d] + meta.shape[d + 1:], meta.dtype)
    return jnp.moveaxis(out.at[windows].add(g), 0, d)
