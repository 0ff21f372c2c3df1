"""``embedding_bag``: sums, means or maxima of bags of embedding rows, and its gradients.

Bag ``b`` holds the indices from ``offsets[b]`` up to the next offset (the last bag runs to
the end, or to the extra last offset with ``include_last_offset``). Indices equal to
``padding_idx`` (``-1``: none) take no part; empty bags give zeros. ``per_sample_weights``
scale rows (sum mode only, as PyTorch checks).

Besides the result, ``_embedding_bag`` returns the auxiliary tensors its backward reads,
with the shapes PyTorch's meta kernel gives: ``offset2bag`` (each index's bag),
``bag_size`` (each bag's number of non-padding indices) and ``max_indices`` (the weight row
each maximum came from, max mode; empty otherwise). Sparse gradients are not supported.
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import compute_in_opmath as _f
from torchspmd.lowering.registry import lowers

aten = ops.aten

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices, offsets, include_last_offset: bool):
    """(bag of each index, number of bags)."""
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags] if include_last_offset else offsets
    position = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    return jnp.searchsorted(starts, position, side="right").astype(jnp.int64) - 1, bags


def _kept(indices, bag, bags, padding_idx: int):
    """Which indices count: not padding, and inside a bag (``include_last_offset`` may cut)."""
    kept = (bag >= 0) & (bag < bags)
    return kept if padding_idx < 0 else kept & (indices != padding_idx)


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(meta, weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM,
                  sparse=False, per_sample_weights=None, include_last_offset=False,
                  padding_idx=-1):
    out_meta, offset2bag_meta, bag_size_meta, max_meta = meta
    bag, bags = _bags(indices, offsets, include_last_offset)
    kept = _kept(indices, bag, bags, padding_idx)
    segment = jnp.where(kept, bag, bags)  # dropped indices go to an extra, discarded segment
    rows = _f(weight, out_meta)[indices]
    if per_sample_weights is not None:
        rows = rows * _f(per_sample_weights, out_meta)[:, None]
    size = jax.ops.segment_sum(kept.astype(jnp.int64), segment, bags + 1)[:bags]
    max_indices = jnp.zeros(max_meta.shape, max_meta.dtype)
    if mode == _MAX:
        out = jax.ops.segment_max(jnp.where(kept[:, None], rows, -jnp.inf), segment, bags + 1)[:bags]
        out = jnp.where(size[:, None] > 0, out, 0)
        # The first index reaching the maximum, per bag and column (CPU's strict > scan).
        position = jnp.arange(indices.shape[0])[:, None]
        hit = kept[:, None] & (rows == out[jnp.clip(bag, 0, bags - 1)])
        first = jax.ops.segment_min(jnp.where(hit, position, indices.shape[0]), segment, bags + 1)[:bags]
        chosen = indices[jnp.clip(first, 0, indices.shape[0] - 1)]
        max_indices = jnp.where(size[:, None] > 0, chosen, 0).astype(max_meta.dtype)
    else:
        out = jax.ops.segment_sum(jnp.where(kept[:, None], rows, 0), segment, bags + 1)[:bags]
        if mode == _MEAN:
            out = out / jnp.maximum(size, 1)[:, None].astype(out.dtype)
    # With include_last_offset the meta kernel sizes bag_size by the offsets: pad it.
    bag_size = jnp.zeros(bag_size_meta.shape, bag_size_meta.dtype).at[:bags].set(size)
    return out.astype(out_meta.dtype), bag.astype(offset2bag_meta.dtype), bag_size, max_indices


def _dense_backward(meta, grad, indices, bag, bag_size, maximum_indices, num_weights,
                    scale_grad_by_freq, mode, per_sample_weights, padding_idx):
    g = _f(grad, meta)
    bags = g.shape[0]
    bag_size = bag_size[:bags]
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype)
    if mode == _MAX:
        columns = jnp.arange(g.shape[1])[None, :]
        g = jnp.where((bag_size > 0)[:, None], g, 0)
        return out.at[maximum_indices, columns].add(g).astype(meta.dtype)
    kept = _kept(indices, bag, bags, padding_idx)
    rows = g[jnp.clip(bag, 0, bags - 1)]
    if mode == _MEAN:
        rows = rows / jnp.maximum(bag_size, 1)[jnp.clip(bag, 0, bags - 1)][:, None].astype(g.dtype)
    if per_sample_weights is not None:
        rows = rows * _f(per_sample_weights, meta)[:, None]
    rows = jnp.where(kept[:, None], rows, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, g.dtype).at[indices].add(kept.astype(g.dtype))
        rows = rows / jnp.maximum(counts[indices], 1)[:, None]
    return out.at[indices].add(rows).astype(meta.dtype)


def _no_sparse(sparse: bool) -> None:
    if sparse:
        raise NotImplementedError("torchspmd: embedding_bag(sparse=True) needs sparse "
                                  "gradients, which the spmd device does not support; "
                                  "use sparse=False.")


@lowers(aten._embedding_bag_backward.default)
def embedding_bag_backward(meta, grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, padding_idx=-1):
    _no_sparse(sparse)
    return _dense_backward(meta, grad, indices, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowers(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(meta, grad, indices, offset2bag, bag_size, maximum_indices,
                                 num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                 padding_idx=-1):
    return _dense_backward(meta, grad, indices, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(meta, grad, weight, indices, offsets, offset2bag,
                                              mode, padding_idx=-1):
    g = _f(grad, meta)
    bags = g.shape[0]
    kept = _kept(indices, offset2bag, bags, padding_idx)
    per_index = jnp.sum(g[jnp.clip(offset2bag, 0, bags - 1)] * _f(weight, meta)[indices], axis=1)
    return jnp.where(kept, per_index, 0).astype(meta.dtype)
