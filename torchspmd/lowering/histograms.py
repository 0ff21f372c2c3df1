"""Histograms with a fixed number of bins: ``histc`` and ``histogram(bins=int)``.

Bins are equal-width between a low and a high edge (the data's min and max when the
caller gives none, widened by 1 (``histc``) or 0.5 (``histogram``) when they are equal, as
PyTorch does). An element's bin is
found as PyTorch's CPU kernel finds it: by linear interpolation, corrected by one against
the bin edges, the high edge falling in the last bin; elements outside the edges and NaNs
are not counted.
"""

import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import cast
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten


def _data_range(x, low, high, widen):
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
    return jnp.where(same, low - widen, low), jnp.where(same, high + widen, high)


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
    low, high = _data_range(x, low, high, widen=1)
    return _counts(x, bins, low, high, None, meta.dtype)[0]


@infers(aten.histogram.bin_ct)
def _histogram_shapes(x, bins=100, *, range=None, weight=None, density=False):
    """PyTorch has no meta kernel for it: ``bins`` counts and ``bins + 1`` edges."""
    return x.new_empty((bins,)), x.new_empty((bins + 1,))


@lowers(aten.histogram.bin_ct)
def histogram(meta, x, bins=100, *, range=None, weight=None, density=False):
    hist_meta, edges_meta = meta
    if range is not None:
        low, high = float(range[0]), float(range[1])
    else:
        low, high = (0.0, 1.0) if x.size == 0 else (0.0, 0.0)  # an empty input: [0, 1]
    low, high = _data_range(x, cast(low, x.dtype), cast(high, x.dtype), widen=0.5)
    hist, edges = _counts(x, bins, low, high, weight, hist_meta.dtype)
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges).astype(hist.dtype))
    return hist, edges.astype(edges_meta.dtype)


@infers(aten.histogram.bins_tensor)
def _histogram_edges_shapes(x, bins, *, weight=None, density=False):
    """PyTorch has no meta kernel for it: one count per gap between the given edges."""
    return x.new_empty((bins.shape[0] - 1,)), x.new_empty(bins.shape)


@lowers(aten.histogram.bins_tensor)
def histogram_edges(meta, x, bins, *, weight=None, density=False):
    """A histogram over given (increasing) edges: an element's bin by binary search."""
    hist_meta, edges_meta = meta
    count = bins.shape[0] - 1
    flat, edges = x.reshape(-1), bins.astype(x.dtype)
    pos = jnp.searchsorted(edges, flat, side="right") - 1
    pos = jnp.where(flat == edges[-1], count - 1, pos)  # the last edge closes the last bin
    inside = (pos >= 0) & (pos < count) & ~jnp.isnan(flat)
    dtype = hist_meta.dtype
    w = jnp.ones(flat.shape, dtype) if weight is None else weight.reshape(-1).astype(dtype)
    hist = jnp.zeros(count, dtype).at[jnp.clip(pos, 0, count - 1)].add(jnp.where(inside, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges).astype(dtype))
    return hist, bins.astype(edges_meta.dtype)
