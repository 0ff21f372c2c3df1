"""Lowerings of indexing, gather/scatter, sorting and searching ops.

Advanced indexing (``index.Tensor``) follows NumPy's rules, as PyTorch does: index tensors
separated by a slice move their dims to the front. Boolean masks in ``index.Tensor`` have
a data-dependent result shape (the meta kernel fails), so only integer indices arrive;
``index_put`` does take a lone boolean mask (``x[mask] = v``), lowered with a where /
prefix-sum gather so the shape stays static. ``nonzero``, ``masked_select``, ``unique``
are not lowered: their result shapes depend on the data, so the device layer reads the
size first and records a static-size op (``device/data_dependent.py``, ``sized.py``).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from torch import ops

from torchspmd.lowering._common import cast, wrap_dim
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _index_tuple(indices) -> tuple:
    """aten's ``Tensor?[] indices`` as a NumPy index (``None`` = the whole dim)."""
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        raise NotImplementedError("torchspmd: boolean mask indexing has a data-dependent shape; "
                                  "use torch.where or masked_fill instead")
    return tuple(slice(None) if i is None else i for i in indices)


def _grid(index, dim: int) -> tuple:
    """The full index of gather/scatter: ``index`` along ``dim``, the position elsewhere."""
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d)
                 for d in range(index.ndim))


def _along(dim: int, index) -> tuple:
    """Index tuple picking ``index`` (a 1-D array) along ``dim``."""
    return (slice(None),) * dim + (index,)


# ---------------------------------------------------------------- reading
@lowers(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(meta, x, indices):
    return x[_index_tuple(indices)]


@lowers(aten._unsafe_masked_index.default)
def unsafe_masked_index(meta, x, mask, indices, fill):
    got = x[_index_tuple(indices)]
    return jnp.where(mask, got, cast(fill, meta.dtype)).astype(meta.dtype)


@lowers(aten.gather.default)
def gather(meta, x, dim, index, *, sparse_grad=False):
    return x[_grid(index, wrap_dim(dim, x.ndim))]


@lowers(aten.index_select.default)
def index_select(meta, x, dim, index):
    x1 = jnp.atleast_1d(x)
    return jnp.take(x1, index.reshape(-1), axis=wrap_dim(dim, x1.ndim)).reshape(meta.shape)


@lowers(aten.take.default)
def take(meta, x, index):
    return x.reshape(-1)[index]


@lowers(aten.embedding.default)
def embedding(meta, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(meta, x, mask, value):
    return jnp.where(mask, cast(value, meta.dtype), x.astype(meta.dtype))


# ---------------------------------------------------------------- writing
def _mask_put(x, mask, p: int, values, accumulate: bool):
    """``x[(:,)*p + (mask,)] = values`` (or ``+=``) with a static shape.

    The selected elements of the masked dims are numbered by a prefix sum over the mask;
    the k-th selected element takes ``values``'s k-th entry along the mask axis (or its only
    entry, when that axis has size 1 and broadcasts).
    """
    rest = x.shape[p + mask.ndim:]
    target = p + 1 + len(rest)
    values = values.reshape((1,) * (target - values.ndim) + values.shape)
    count = values.shape[p]
    if count == 0:  # nothing is selected
        return x
    values = jnp.broadcast_to(values, x.shape[:p] + (count,) + rest)
    position = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, count - 1)
    picked = jnp.take(values, position, axis=p).reshape(x.shape)
    where = mask.reshape((1,) * p + mask.shape + (1,) * len(rest))
    return jnp.where(where, x + picked if accumulate else picked, x)


def _scatter_into(x):
    """``x`` as the operand of a scatter, behind an optimization barrier.

    XLA's SPMD partitioner miscompiles two chained scatters into a replicated operand
    whose result is sharded (2 or 4 shards of 8 elements): the second reads the first's
    *input* for some shards (plain-JAX repro: tests/lowering/test_xla_scatter_chain.py;
    found by the fuzzer, seed 0 program 627). The barrier keeps each scatter's operand a
    value of its own, which the partitioner gets right. When that test fails, XLA is
    fixed and this can go.
    """
    return jax.lax.optimization_barrier(x)


@lowers(aten.index_put.default, aten._unsafe_index_put.default, aten._index_put_impl.default)
def index_put(meta, x, indices, values, accumulate=False, unsafe=False):
    x, values = x.astype(meta.dtype), values.astype(meta.dtype)
    given = [p for p, i in enumerate(indices) if i is not None]
    if len(given) == 1 and indices[given[0]].dtype == jnp.bool_:
        return _mask_put(x, indices[given[0]], given[0], values, accumulate)
    at = _scatter_into(x).at[_index_tuple(indices)]
    return at.add(values) if accumulate else at.set(values)


@lowers(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(meta, x, mask, indices, values):
    values = jnp.where(mask, values.astype(meta.dtype), 0)
    return _scatter_into(x.astype(meta.dtype)).at[_index_tuple(indices)].add(values, mode="drop")


@lowers(aten.put.default)
def put(meta, x, index, source, accumulate=False):
    at = _scatter_into(x.astype(meta.dtype).reshape(-1)).at[index.reshape(-1)]
    src = source.astype(meta.dtype).reshape(-1)
    return (at.add(src) if accumulate else at.set(src)).reshape(meta.shape)


@lowers(aten.masked_scatter.default)
def masked_scatter(meta, x, mask, source):
    """The k-th True of the (broadcast) mask takes ``source.flatten()[k]``."""
    if source.size == 0:
        return jnp.broadcast_to(x, meta.shape).astype(meta.dtype)
    m = jnp.broadcast_to(mask, meta.shape).reshape(-1)
    position = jnp.clip(jnp.cumsum(m) - 1, 0, source.size - 1)
    picked = source.reshape(-1)[position].astype(meta.dtype)
    return jnp.where(m, picked, jnp.broadcast_to(x, meta.shape).reshape(-1)).reshape(meta.shape)


@lowers(aten.masked_scatter_backward.default)
def masked_scatter_backward(meta, grad, mask, sizes):
    n = math.prod(meta.shape)
    m = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    position = jnp.where(m, jnp.cumsum(m) - 1, n)  # unselected -> out of range, dropped
    out = jnp.zeros(n, meta.dtype).at[position].set(grad.reshape(-1).astype(meta.dtype), mode="drop")
    return out.reshape(meta.shape)


# scatter's `reduce` strings (old and new spellings) as `.at[]` methods.
_AT_METHOD = {None: "set", "add": "add", "multiply": "multiply", "sum": "add", "prod": "multiply",
              "amax": "max", "amin": "min"}


def _identity(reduce: str, dtype):
    """The start value of a reduction that leaves out ``self`` (``include_self=False``)."""
    if reduce in ("sum", "mean", "prod"):
        return int(reduce == "prod")
    if _is_float(dtype):
        low, high = -jnp.inf, jnp.inf
    elif dtype == jnp.bool_:
        low, high = False, True
    else:
        low, high = jnp.iinfo(dtype).min, jnp.iinfo(dtype).max
    return low if reduce == "amax" else high


def _reduce_into(x, idx, src, reduce: str, include_self: bool):
    """``scatter_reduce``/``index_reduce`` at index ``idx`` (``.at[]`` syntax) of ``x``."""
    x = _scatter_into(x)
    if not include_self:
        # Two scatters in a row: the second one's operand needs the barrier too.
        x = _scatter_into(x.at[idx].set(jnp.asarray(_identity(reduce, x.dtype), x.dtype)))
    if reduce != "mean":
        return getattr(x.at[idx], _AT_METHOD[reduce])(src)
    total = x.at[idx].add(src)
    count = jnp.zeros(x.shape, x.dtype).at[idx].add(jnp.ones(src.shape, x.dtype)) + include_self
    count = jnp.maximum(count, 1)
    return total / count if _is_float(x.dtype) else total // count


def _sliced_like(src, index):
    """``src`` cut to ``index``'s shape (scatter reads only that corner of ``src``)."""
    return src[tuple(slice(0, n) for n in index.shape)]


@lowers(aten.scatter.src, aten.scatter.reduce)
def scatter(meta, x, dim, index, src, *, reduce=None):
    src = _sliced_like(src, index).astype(meta.dtype)
    at = _scatter_into(x.astype(meta.dtype)).at[_grid(index, wrap_dim(dim, x.ndim))]
    return getattr(at, _AT_METHOD[reduce])(src)


@lowers(aten.scatter_add.default)
def scatter_add(meta, x, dim, index, src):
    return scatter(meta, x, dim, index, src, reduce="add")


@lowers(aten.scatter.value, aten.scatter.value_reduce)
def scatter_value(meta, x, dim, index, value, *, reduce=None):
    at = _scatter_into(x.astype(meta.dtype)).at[_grid(index, wrap_dim(dim, x.ndim))]
    return getattr(at, _AT_METHOD[reduce])(cast(value, meta.dtype))


@lowers(aten.scatter_reduce.two)
def scatter_reduce(meta, x, dim, index, src, reduce, *, include_self=True):
    src = _sliced_like(src, index).astype(meta.dtype)
    return _reduce_into(x.astype(meta.dtype), _grid(index, wrap_dim(dim, x.ndim)), src, reduce, include_self)


def _index_update(meta, x, dim, index, source):
    """``index_*`` ops' operands: ``x`` as >= 1-d, the dim, 1-d ``index``, and ``source``
    reshaped to the selected block (``None`` stays ``None``); 0-d tensors act as 1-element."""
    x1 = jnp.atleast_1d(x.astype(meta.dtype))
    d, index = wrap_dim(dim, x1.ndim), index.reshape(-1)
    if source is not None:
        source = source.reshape(x1.shape[:d] + index.shape + x1.shape[d + 1:])
    return x1, d, index, source


@lowers(aten.index_add.default)
def index_add(meta, x, dim, index, source, *, alpha=1):
    x1, d, index, source = _index_update(meta, x, dim, index, source)
    src = source.astype(meta.dtype) * cast(alpha, meta.dtype)
    return x1.at[_along(d, index)].add(src).reshape(meta.shape)


@lowers(aten.index_copy.default)
def index_copy(meta, x, dim, index, source):
    x1, d, index, source = _index_update(meta, x, dim, index, source)
    return x1.at[_along(d, index)].set(source.astype(meta.dtype)).reshape(meta.shape)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(meta, x, dim, index, value):
    x1, d, index, _ = _index_update(meta, x, dim, index, None)
    return x1.at[_along(d, index)].set(cast(value, meta.dtype)).reshape(meta.shape)


@lowers(aten.index_reduce.default)
def index_reduce(meta, x, dim, index, source, reduce, *, include_self=True):
    x1, d, index, source = _index_update(meta, x, dim, index, source)
    return _reduce_into(x1, _along(d, index), source.astype(meta.dtype), reduce, include_self).reshape(meta.shape)


@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(meta, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    acc = jnp.promote_types(meta.dtype, jnp.float32)  # accumulate half types in float32
    idx = indices.reshape(-1)
    g = grad.reshape(idx.shape[0], -1).astype(acc)
    if scale_grad_by_freq:
        g = g / jnp.zeros(num_weights, acc).at[idx].add(1)[idx][:, None]
    g = jnp.where((idx != padding_idx)[:, None], g, 0)
    return jnp.zeros(meta.shape, acc).at[idx].add(g).astype(meta.dtype)


@lowers(aten.embedding_renorm.default)
def embedding_renorm(meta, weight, indices, max_norm, norm_type):
    """Rows of ``weight`` named in ``indices`` whose ``norm_type``-norm exceeds ``max_norm``
    are scaled to ``max_norm`` (``F.embedding(max_norm=...)``), each row once."""
    w = weight.astype(jnp.promote_types(meta.dtype, jnp.float32))
    named = jnp.zeros(w.shape[0], bool).at[indices.reshape(-1)].set(True)
    p = float(norm_type)
    norms = jnp.sum(jnp.abs(w) ** p, axis=1) ** (1 / p)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return (w * scale[:, None].astype(w.dtype)).astype(meta.dtype)


@lowers(aten.repeat_interleave.Tensor)
def repeat_interleave(meta, repeats, *, output_size=None):
    """Only reaches us with ``output_size`` given (otherwise the shape is data-dependent)."""
    positions = jnp.arange(repeats.shape[0], dtype=meta.dtype)
    return jnp.repeat(positions, repeats, total_repeat_length=meta.shape[0])


# ---------------------------------------------------------------- sorting and searching
def _sort_keys(x, descending: bool) -> tuple:
    """Keys whose ascending lexicographic order is PyTorch's order of ``x``.

    NaN sorts as the largest value; -0.0 and 0.0 tie (XLA's float order would split them).
    """
    if _is_float(x.dtype):
        nan = jnp.isnan(x)
        v = jnp.where(nan | (x == 0), jnp.zeros((), x.dtype), x)
        return (~nan, -v) if descending else (nan, v)
    return (~x,) if descending else (x,)  # bitwise/logical not reverses integer/bool order


def _sort(x, dim: int, descending: bool):
    """Stable sort along ``dim``: (values, int64 indices)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = wrap_dim(dim, x.ndim)
    keys = _sort_keys(x, descending)
    iota = lax.broadcasted_iota(jnp.int64, x.shape, d)
    order = lax.sort(keys + (iota,), dimension=d, num_keys=len(keys) + 1)[-1]
    return jnp.take_along_axis(x, order, axis=d), order


@lowers(aten.sort.default)
def sort(meta, x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowers(aten.sort.stable)
def sort_stable(meta, x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@lowers(aten.topk.default)
def topk(meta, x, k, dim=-1, largest=True, sorted=True):
    values, order = _sort(x, dim, largest)
    if x.ndim == 0:
        return values, order
    d = wrap_dim(dim, x.ndim)
    return lax.slice_in_dim(values, 0, k, axis=d), lax.slice_in_dim(order, 0, k, axis=d)


@lowers(aten.kthvalue.default)
def kthvalue(meta, x, k, dim=-1, keepdim=False):
    values, order = _sort(x, dim, False)
    if x.ndim == 0:
        return values, order
    d = wrap_dim(dim, x.ndim)
    return (lax.index_in_dim(values, k - 1, d, keepdims=keepdim),
            lax.index_in_dim(order, k - 1, d, keepdims=keepdim))


def _searchsorted(meta, boundaries, values, side: str, sorter=None):
    if sorter is not None:
        boundaries = jnp.take_along_axis(boundaries, sorter, axis=-1)
    values = jnp.asarray(values)
    dtype = jnp.promote_types(boundaries.dtype, values.dtype)
    boundaries, values = boundaries.astype(dtype), values.astype(dtype)
    search = functools.partial(jnp.searchsorted, side=side)
    if boundaries.ndim <= 1:
        return search(boundaries, values).astype(meta.dtype)
    rows = boundaries.reshape(-1, boundaries.shape[-1])
    return jax.vmap(search)(rows, values.reshape(rows.shape[0], -1)).reshape(meta.shape).astype(meta.dtype)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(meta, sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(meta, sorted_sequence, x, side or ("right" if right else "left"), sorter)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(meta, x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(meta, boundaries, x, "right" if right else "left")
