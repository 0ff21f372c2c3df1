"""Order statistics: ``median``, ``nanmedian``, ``mode`` (values and their indices).

All three sort each slice with the stable sort of ``indexing`` (NaN last, as PyTorch
orders it) and pick a position, so they are static-shape and shard like a sort.

- ``median``: the lower of the two middle values; a slice holding NaN gives NaN, indexed
  at its first NaN.
- ``nanmedian``: the median of the non-NaN values (NaN, index of the first NaN, when all
  are NaN).
- ``mode``: the most frequent value, the smallest among equally frequent ones; its index
  is its last occurrence, as PyTorch CPU gives.

Among equal medians PyTorch's CPU kernel (``nth_element``) returns whichever index its
partitioning leaves there; here it is the one a stable sort puts at the middle, which is
the same when values are distinct.
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import is_floating, wrap_dim
from torchspmd.lowering.indexing import _sort
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _last_axis(x, dim):
    """``x`` with ``dim`` moved last (a 0-d tensor becomes a slice of one)."""
    if x.ndim == 0:
        return x.reshape(1), None
    d = wrap_dim(dim, x.ndim)
    return jnp.moveaxis(x, d, -1), d


def _restore(v, d, keepdim: bool, meta):
    """A per-slice result back in the layout ``meta`` asks for."""
    if d is not None and keepdim:
        v = jnp.expand_dims(v, d)
    return v.reshape(meta.shape).astype(meta.dtype)


def _pick(x, dim, ignore_nan: bool):
    """(value, index) of the median of each slice along ``dim`` (dim moved out)."""
    xs, d = _last_axis(x, dim)
    values, order = _sort(xs, -1, False)
    n = xs.shape[-1]
    if is_floating(xs.dtype):
        nans = jnp.sum(jnp.isnan(xs), axis=-1)
        if ignore_nan:
            position = jnp.maximum((n - nans - 1) // 2, 0)
        else:  # any NaN makes the median NaN: the first NaN's place
            position = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    else:
        position = jnp.full(xs.shape[:-1], (n - 1) // 2)
    position = position[..., None]
    value = jnp.take_along_axis(values, position, axis=-1)[..., 0]
    index = jnp.take_along_axis(order, position, axis=-1)[..., 0]
    return value, index, d


@lowers(aten.median.default)
def median(meta, x):
    return _pick(x.reshape(-1), 0, False)[0].astype(meta.dtype).reshape(meta.shape)


@lowers(aten.nanmedian.default)
def nanmedian(meta, x):
    return _pick(x.reshape(-1), 0, True)[0].astype(meta.dtype).reshape(meta.shape)


@lowers(aten.median.dim)
def median_dim(meta, x, dim, keepdim=False):
    value, index, d = _pick(x, dim, False)
    return _restore(value, d, keepdim, meta[0]), _restore(index, d, keepdim, meta[1])


@lowers(aten.nanmedian.dim)
def nanmedian_dim(meta, x, dim, keepdim=False):
    value, index, d = _pick(x, dim, True)
    return _restore(value, d, keepdim, meta[0]), _restore(index, d, keepdim, meta[1])


def _mode_of_row(values, order):
    """Mode of one sorted row: (value, last original index of it)."""
    n = values.shape[0]
    starts = jnp.concatenate([jnp.ones((1,), bool), values[1:] != values[:-1]])
    group = jnp.cumsum(starts) - 1
    counts = jax.ops.segment_sum(jnp.ones(n, jnp.int32), group, num_segments=n)
    best = jnp.argmax(counts)  # the first (smallest value) among the most frequent
    in_best = group == best
    value = values[jnp.argmax(in_best)]
    index = jnp.max(jnp.where(in_best, order, -1))
    return value, index


@lowers(aten.mode.default)
def mode(meta, x, dim=-1, keepdim=False):
    xs, d = _last_axis(x, dim)
    values, order = _sort(xs, -1, False)
    rows, cols = values.reshape(-1, xs.shape[-1]), order.reshape(-1, xs.shape[-1])
    value, index = jax.vmap(_mode_of_row)(rows, cols)
    shape = xs.shape[:-1]
    return (_restore(value.reshape(shape), d, keepdim, meta[0]),
            _restore(index.reshape(shape), d, keepdim, meta[1]))
