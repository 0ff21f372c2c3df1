"""Ops whose output size depends on the data, lowered with that size as a static argument.

``unique``, ``unique_consecutive``, ``bincount``, ``nonzero``: the device layer reads the
size once on the host (``device/data_dependent.py``), then records one of these with the
size fixed, so XLA sees static shapes. Each size-counting pseudo-op computes, on the
device, exactly the size its sized op needs.

``unique`` works on "rows": the tensor flattened (``dim=None``) or moved so that ``dim``
comes first and the other dims are flattened; rows are compared whole. NaNs are distinct
(NaN != NaN), as in PyTorch.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from torch import ops

from torchspmd.lowering._common import wrap_dim
from torchspmd.lowering.registry import lowers

aten = ops.aten


class SizedOp:
    """A pseudo-op recorded like an aten op; ``infer`` gives its outputs on the meta device."""

    def __init__(self, name: str, infer):
        self.__name__ = name
        self._infer = infer

    def __call__(self, *args):
        return self._infer(*args)

    def __repr__(self) -> str:
        return f"torchspmd.{self.__name__}"


def _count_meta(x, *static):
    return x.new_empty((), dtype=torch.int64)


def _unique_meta(x, size, dim, consecutive, return_inverse, return_counts):
    if dim is None:
        values = x.new_empty((size,))
        inverse_shape = x.shape
    else:
        shape = list(x.shape)
        shape[wrap_dim(dim, x.dim())] = size
        values = x.new_empty(shape)
        inverse_shape = (x.shape[wrap_dim(dim, x.dim())],)
    long = torch.int64
    inverse = x.new_empty(inverse_shape if return_inverse else (0,), dtype=long)
    counts = x.new_empty((size,) if return_counts else (0,), dtype=long)
    return values, inverse, counts


def _bincount_meta(x, weights, length):
    if weights is None:
        dtype = torch.int64
    else:
        dtype = weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64
    return x.new_empty((length,), dtype=dtype)


# unique_count(x, dim, consecutive): how many distinct (or consecutive-distinct) rows.
UNIQUE_COUNT = SizedOp("unique_count", _count_meta)
# unique(x, size, dim, consecutive, return_inverse, return_counts) -> (values, inverse, counts)
UNIQUE = SizedOp("unique", _unique_meta)
# bincount(x, weights, length): PyTorch's bincount with its output length given.
BINCOUNT = SizedOp("bincount", _bincount_meta)


def _rows(x, dim):
    """``x`` as a 2-d array of rows to compare, and a function putting rows back."""
    if dim is None:
        return x.reshape(-1, 1), None
    d = wrap_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, d, 0)
    rest = moved.shape[1:]
    return moved.reshape(moved.shape[0], -1), lambda r: jnp.moveaxis(r.reshape(-1, *rest), 0, d)


def _groups(x, dim, consecutive):
    """(rows in compared order, their order in ``x``, a flag where each new group starts)."""
    rows, unrows = _rows(x, dim)
    order = jnp.arange(rows.shape[0])
    if not consecutive and rows.shape[0] > 0:
        # lexsort's last key is the primary one: the first column decides first.
        order = jnp.lexsort(tuple(rows[:, c] for c in reversed(range(rows.shape[1]))))
        rows = rows[order]
    if rows.shape[0] == 0:
        return rows, order, jnp.zeros((0,), bool), unrows
    changed = jnp.any(rows[1:] != rows[:-1], axis=1)
    return rows, order, jnp.concatenate([jnp.ones((1,), bool), changed]), unrows


@lowers(UNIQUE_COUNT)
def unique_count(meta, x, dim, consecutive):
    return jnp.sum(_groups(x, dim, consecutive)[2], dtype=meta.dtype)


@lowers(UNIQUE)
def unique(meta, x, size, dim, consecutive, return_inverse, return_counts):
    values_meta, inverse_meta, counts_meta = meta
    rows, order, starts, unrows = _groups(x, dim, consecutive)
    group = jnp.cumsum(starts, dtype=jnp.int64) - 1  # each sorted row's group
    first = jnp.nonzero(starts, size=size)[0]
    values = rows[first]
    values = values.reshape(-1) if unrows is None else unrows(values)
    inverse = jnp.zeros(inverse_meta.shape, jnp.int64)
    if return_inverse:
        inverse = jnp.zeros(order.shape, jnp.int64).at[order].set(group).reshape(inverse_meta.shape)
    counts = jnp.zeros(counts_meta.shape, jnp.int64)
    if return_counts:
        counts = counts.at[group].add(1)
    return values.astype(values_meta.dtype), inverse, counts


@lowers(BINCOUNT)
def bincount(meta, x, weights, length):
    w = jnp.ones(x.shape, meta.dtype) if weights is None else weights.astype(meta.dtype)
    return jnp.zeros(meta.shape, meta.dtype).at[x].add(w)


@lowers(aten.nonzero_static.default)
def nonzero_static(meta, x, *, size, fill_value=-1):
    """Indices of non-zero elements, row-major, padded with ``fill_value`` to ``size`` rows."""
    if x.ndim == 0:  # one element, no coordinates: rows of width 0
        return jnp.zeros(meta.shape, meta.dtype)
    found = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(found, axis=1).astype(meta.dtype).reshape(meta.shape)
