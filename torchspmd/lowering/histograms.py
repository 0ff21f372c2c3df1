"""Histograms with a fixed number of bins: ``histc``.

Bins are equal-width between a low and a high edge (the data's min and max when the
caller gives none, widened when they are equal, as PyTorch does). An element's bin is
found as PyTorch's CPU kernel finds it: by linear interpolation, corrected by one against
the bin edges, the high edge falling in the last bin; elements outside the edges and NaNs
are not counted.
"""

import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import cast
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _data_range(x, low, high):
    """(low, high): the given edges, or the data's min and max where both are equal."""
    flat = x.reshape(-1)
    finite = ~jnp.isnan(flat)
    data_low = jnp.min(jnp.where(finite, flat, jnp.inf), initial=jnp.inf)
    data_high = jnp.max(jnp.where(finite, flat, -jnp.inf), initial=-jnp.inf)
    empty = data_low > data_high  # no (non-NaN) element: keep the given edges
    use_data = (low == high) & ~empty
    low = jnp.where(use_data, data_low, low)
    high = jnp.where(use_data, data_high, high)
    same = low == high
    return jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)


def _linspace(low, high, steps: int, dtype):
    """``torch.linspace`` as its CPU kernel computes it (from both ends, in ``dtype``)."""
    i = jnp.arange(steps, dtype=dtype)
    step = (high - low) / (steps - 1)
    return jnp.where(i < steps // 2, low + step * i, high - step * (steps - 1 - i))


def _counts(x, bins: int, low, high, weight, dtype):
    """Per-bin sums of ``weight`` (ones by default) and the bins' edges."""
    flat = x.reshape(-1)
    edges = _linspace(low, high, bins + 1, x.dtype)
    guess = jnp.clip(((flat - low) * bins / (high - low)).astype(jnp.int64), 0, bins)
    # CPU's local search: upper_bound over edges[guess - 1 : guess + 2], minus one.
    first = jnp.maximum(guess - 1, 0)
    window = first[:, None] + jnp.arange(3)[None, :]
    below = (window <= bins) & (edges[jnp.clip(window, 0, bins)] <= flat[:, None])
    pos = first + jnp.sum(below, axis=1) - 1
    pos = jnp.clip(jnp.where(pos == bins, bins - 1, pos), 0, bins - 1)  # the high edge: last bin
    inside = (flat >= low) & (flat <= high) & ~jnp.isnan(flat)
    w = jnp.ones(flat.shape, dtype) if weight is None else weight.reshape(-1).astype(dtype)
    hist = jnp.zeros(bins, dtype).at[pos].add(jnp.where(inside, w, 0))
    return hist, edges


@lowers(aten.histc.default)
def histc(meta, x, bins=100, min=0, max=0):
    low, high = cast(min, x.dtype), cast(max, x.dtype)
    low, high = _data_range(x, low, high)
    return _counts(x, bins, low, high, None, meta.dtype)[0]
