"""``segment_reduce``: reductions over consecutive segments of one axis, and its backward.

Segments are given by ``lengths`` or by ``offsets`` (one-dimensional: the same segments for
every slice of the other dims). ``initial`` takes part in each segment's reduction, and
is an empty segment's value; without it an empty segment is 0 (sum), 1 (prod), -inf
(max), inf (min) or NaN (mean), as PyTorch's kernel gives. A mean divides by the segment's
length (``initial`` included in the numerator).
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import wrap_dim
from torchspmd.lowering.registry import lowers

aten = ops.aten

_EMPTY = {"sum": 0.0, "prod": 1.0, "max": -jnp.inf, "min": jnp.inf, "mean": jnp.nan}


def _segments(op: str, data, lengths, offsets, axis: int):
    """(segment id of each position along ``axis``, per-segment length, segment count)."""
    given = lengths if lengths is not None else offsets
    if given is None or given.ndim != 1:
        raise NotImplementedError(
            f"torchspmd: {op} supports one-dimensional lengths or offsets (the same "
            "segments for every slice); reshape the data so the segmented axis comes with "
            "one set of segments.")
    if lengths is None:
        lengths = jnp.diff(offsets)
    ends = jnp.cumsum(lengths)
    position = jnp.arange(data.shape[axis])
    return jnp.searchsorted(ends, position, side="right"), lengths, lengths.shape[0]


def _reduce(data, ids, count, reduce: str):
    if reduce in ("sum", "mean"):
        return jax.ops.segment_sum(data, ids, count + 1)[:count]
    if reduce == "prod":
        return jax.ops.segment_prod(data, ids, count + 1)[:count]
    if reduce == "max":
        return jax.ops.segment_max(data, ids, count + 1)[:count]
    return jax.ops.segment_min(data, ids, count + 1)[:count]


def _check_reduce(reduce: str) -> None:
    if reduce not in _EMPTY:
        raise ValueError(f"torchspmd: segment_reduce: reduce must be one of {sorted(_EMPTY)}, "
                         f"got {reduce!r}")


@lowers(aten.segment_reduce.default)
def segment_reduce(meta, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    _check_reduce(reduce)
    axis = wrap_dim(axis, data.ndim)
    ids, length, count = _segments("segment_reduce", data, lengths, offsets, axis)
    x = jnp.moveaxis(data, axis, 0)
    out = _reduce(x, ids, count, reduce)
    shape = (count,) + (1,) * (x.ndim - 1)
    empty = (length == 0).reshape(shape)
    if initial is not None:
        init = jnp.asarray(initial, out.dtype)
        if reduce in ("sum", "mean"):
            out = out + init
        elif reduce == "prod":
            out = out * init
        elif reduce == "max":
            out = jnp.maximum(out, init)
        else:
            out = jnp.minimum(out, init)
        out = jnp.where(empty, init, out)
    else:
        out = jnp.where(empty, jnp.asarray(_EMPTY[reduce], out.dtype), out)
    if reduce == "mean":
        out = jnp.where(empty, out, out / length.reshape(shape).astype(out.dtype))
    return jnp.moveaxis(out, 0, axis).astype(meta.dtype)


@lowers(aten._segment_reduce_backward.default)
def segment_reduce_backward(meta, grad, output, data, reduce, *, lengths=None, offsets=None,
                            axis=0, initial=None):
    _check_reduce(reduce)
    if reduce == "prod":
        raise NotImplementedError("torchspmd: the gradient of segment_reduce(reduce='prod') "
                                  "is not supported; use 'sum' of logs, or compute on the CPU.")
    axis = wrap_dim(axis, data.ndim)
    ids, length, count = _segments("segment_reduce backward", data, lengths, offsets, axis)
    x, g, out = (jnp.moveaxis(t, axis, 0) for t in (data, grad, output))
    safe = jnp.clip(ids, 0, count - 1)
    inside = (ids < count).reshape((-1,) + (1,) * (x.ndim - 1))
    per_position = g[safe]
    if reduce == "mean":
        shape = (count,) + (1,) * (x.ndim - 1)
        per_position = (g / jnp.maximum(length, 1).reshape(shape).astype(g.dtype))[safe]
    elif reduce in ("max", "min"):  # shared among the elements equal to the result
        hit = x == out[safe]
        ties = jax.ops.segment_sum(hit.astype(g.dtype), ids, count + 1)[:count]
        per_position = jnp.where(hit, per_position / jnp.maximum(ties, 1)[safe], 0)
    return jnp.moveaxis(jnp.where(inside, per_position, 0), 0, axis).astype(meta.dtype)
