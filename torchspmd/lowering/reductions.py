"""Reductions and scans -> JAX: sum/mean/prod, max/min and their indices, var/std,
norms, logsumexp, cumulative ops, all/any.

Accumulation happens in ``opmath(meta.dtype)`` (float32 for half types; the meta dtype
already carries PyTorch's integer rules, e.g. sum of int32 -> int64).
"""

import jax.numpy as jnp
import torch
from jax import lax
from jax.nn import logsumexp as _jax_logsumexp

from torchspmd.lowering._common import (cast, centered_sums, is_complex, opmath, reduced_count,
                                         reduction_axes, wrap_dim)
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _reduce(fn, meta, x, dim=None, keepdim=False, *, empty_means_all=True, upcast=True):
    """``fn(x, axis=..., keepdims=...)`` with ``x`` in ``opmath(meta.dtype)``, as ``meta.dtype``."""
    axes = reduction_axes(dim, x.ndim, empty_means_all)
    x = x.astype(opmath(meta.dtype) if upcast else meta.dtype)
    return fn(x, axis=axes, keepdims=keepdim).astype(meta.dtype).reshape(meta.shape)


# ------------------------------------------------------------------ sum, mean, prod

def _nansum(x, **kw):
    return jnp.sum(jnp.where(jnp.isnan(x), jnp.zeros_like(x), x), **kw)


_SUMLIKE = {
    (aten.sum.default, aten.sum.dim_IntList): jnp.sum,
    (aten.mean.default, aten.mean.dim): jnp.mean,
    (aten.prod.default, aten.prod.dim_int): jnp.prod,
    (aten.nansum.default,): _nansum,
}


def _sumlike(fn):
    def lower(meta, x, dim=None, keepdim=False, *, dtype=None):
        return _reduce(fn, meta, x, dim, keepdim)
    return lower


for _ops, _fn in _SUMLIKE.items():
    lowers(*_ops)(_sumlike(_fn))


@lowers(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(meta, x, dim=None):
    return _reduce(jnp.sum, meta, x != 0, dim)


# ------------------------------------------------------------------- max, min, arg*
# jnp.max/min propagate NaN and jnp.argmax/argmin pick the first NaN, then the first
# extreme value: PyTorch's rules.

@lowers(aten.amax.default)
def amax(meta, x, dim=(), keepdim=False):
    return _reduce(jnp.max, meta, x, dim, keepdim, upcast=False)


@lowers(aten.amin.default)
def amin(meta, x, dim=(), keepdim=False):
    return _reduce(jnp.min, meta, x, dim, keepdim, upcast=False)


@lowers(aten.max.default)
def max_(meta, x):
    return jnp.max(x).astype(meta.dtype)


@lowers(aten.min.default)
def min_(meta, x):
    return jnp.min(x).astype(meta.dtype)


@lowers(aten.aminmax.default)
def aminmax(meta, x, *, dim=None, keepdim=False):
    return (_reduce(jnp.min, meta[0], x, dim, keepdim, upcast=False),
            _reduce(jnp.max, meta[1], x, dim, keepdim, upcast=False))


def _arg(fn, meta, x, dim, keepdim):
    if dim is None:
        return fn(x.reshape(-1)).astype(meta.dtype).reshape(meta.shape)
    if x.ndim == 0:
        wrap_dim(dim, 0)
        return jnp.zeros(meta.shape, meta.dtype)
    return fn(x, axis=wrap_dim(dim, x.ndim), keepdims=keepdim).astype(meta.dtype)


@lowers(aten.argmax.default)
def argmax(meta, x, dim=None, keepdim=False):
    return _arg(jnp.argmax, meta, x, dim, keepdim)


@lowers(aten.argmin.default)
def argmin(meta, x, dim=None, keepdim=False):
    return _arg(jnp.argmin, meta, x, dim, keepdim)


@lowers(aten.max.dim)
def max_dim(meta, x, dim, keepdim=False):
    return (_reduce(jnp.max, meta[0], x, dim, keepdim, upcast=False),
            _arg(jnp.argmax, meta[1], x, dim, keepdim))


@lowers(aten.min.dim)
def min_dim(meta, x, dim, keepdim=False):
    return (_reduce(jnp.min, meta[0], x, dim, keepdim, upcast=False),
            _arg(jnp.argmin, meta[1], x, dim, keepdim))


# ------------------------------------------------------------------------ var, std

def _var_mean(meta, x, dim, correction, keepdim):
    axes = reduction_axes(dim, x.ndim)
    # A complex input has a real variance (meta) but a complex mean: keep it complex.
    x = x if is_complex(x.dtype) else x.astype(opmath(meta.dtype))
    n = reduced_count(x.shape, axes)
    if is_complex(x.dtype):  # |x - mean|^2 summed, corrected as ``centered_sums`` does
        mean = jnp.mean(x, axis=axes, keepdims=True)
        dev = x - mean
        shift = jnp.sum(dev, axis=axes)
        mean = mean + jnp.expand_dims(shift / n, axes)
        sq = jnp.sum(jnp.square(jnp.abs(dev)), axis=axes) - jnp.square(jnp.abs(shift)) / n
        sq = jnp.maximum(sq, 0)
    else:
        mean, sq = centered_sums(x, axes)
    sq = jnp.expand_dims(sq, axes) if keepdim else sq
    correction = 1 if correction is None else correction
    var = sq / jnp.maximum(n - cast(correction, sq.dtype), 0)
    return var, (mean if keepdim else jnp.squeeze(mean, axes))


@lowers(aten.var.correction)
def var(meta, x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(meta, x, dim, correction, keepdim)[0].astype(meta.dtype)


@lowers(aten.std.correction)
def std(meta, x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(meta, x, dim, correction, keepdim)[0]).astype(meta.dtype)


@lowers(aten.var_mean.correction)
def var_mean(meta, x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(meta[0], x, dim, correction, keepdim)
    return v.astype(meta[0].dtype), m.astype(meta[1].dtype)


@lowers(aten.std_mean.correction)
def std_mean(meta, x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(meta[0], x, dim, correction, keepdim)
    return jnp.sqrt(v).astype(meta[0].dtype), m.astype(meta[1].dtype)


# ----------------------------------------------------------------- logsumexp, norms

@lowers(aten.logsumexp.default)
def logsumexp(meta, x, dim, keepdim=False):
    return _reduce(_jax_logsumexp, meta, x, dim, keepdim)


def vector_norm(x, ord, axes, keepdim):
    """``sum(|x|**ord) ** (1/ord)`` over ``axes``, with PyTorch's ord = 0, +-inf cases.

    A Python ``ord`` picks its formula statically; a traced ``ord`` selects among them.
    """
    a = jnp.abs(x)
    kw = dict(axis=axes, keepdims=keepdim)
    if isinstance(ord, (int, float)):
        if ord == float("inf"):
            return jnp.max(a, **kw)
        if ord == float("-inf"):
            return jnp.min(a, **kw)
        if ord == 0:
            return jnp.sum(a != 0, **kw).astype(x.dtype)
        if ord == 1:
            return jnp.sum(a, **kw)
        if ord == 2:
            return jnp.sqrt(jnp.sum(a * a, **kw))
        return jnp.sum(a ** ord, **kw) ** (1.0 / ord)
    p = cast(ord, x.dtype)
    general = jnp.sum(a ** p, **kw) ** (1 / p)
    # Every branch is computed: identities keep max/min defined over an empty reduction
    # (|x| >= 0, so they change nothing otherwise; PyTorch rejects inf norms of empty input).
    return jnp.where(p == jnp.inf, jnp.max(a, initial=0, **kw),
                     jnp.where(p == -jnp.inf, jnp.min(a, initial=jnp.inf, **kw),
                               jnp.where(p == 0, jnp.sum(a != 0, **kw).astype(x.dtype), general)))


def _norm(meta, x, ord, dim, keepdim):
    axes = reduction_axes(dim, x.ndim)
    x = jnp.abs(x) if is_complex(x.dtype) else x  # the norm of a complex tensor is real
    out = vector_norm(x.astype(opmath(meta.dtype)), 2 if ord is None else ord, axes, keepdim)
    return out.astype(meta.dtype).reshape(meta.shape)


@lowers(aten.linalg_vector_norm.default)
def linalg_vector_norm(meta, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _norm(meta, x, ord, dim, keepdim)


@lowers(aten.norm.Scalar, aten.norm.ScalarOpt_dtype)
def norm(meta, x, p=2, *, dtype=None):
    return _norm(meta, x, p, None, False)


@lowers(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)
def norm_dim(meta, x, p, dim, keepdim=False, *, dtype=None):
    return _norm(meta, x, p, dim, keepdim)


# ------------------------------------------------------------------------ all, any

def _truth(fn):
    def lower(meta, x, dim=None, keepdim=False):
        # all.dims/any.dims with dim=[] reduce nothing (PyTorch), unlike sum's dim=[].
        return _reduce(fn, meta, x != 0, dim, keepdim, empty_means_all=False, upcast=False)
    return lower


lowers(aten.all.default, aten.all.dim, aten.all.dims)(_truth(jnp.all))
lowers(aten.any.default, aten.any.dim, aten.any.dims)(_truth(jnp.any))


# ``torch._is_all_true(t)`` / ``_is_any_true``: a bool tensor's all/any as a 0-d bool, what
# ``torch.distributions`` checks its arguments with (``validate_args``).
@lowers(aten._is_all_true.default)
def is_all_true(meta, x):
    return jnp.all(x)


@lowers(aten._is_any_true.default)
def is_any_true(meta, x):
    return jnp.any(x)


# ------------------------------------------------------------------------- scans

def _scan(fn, meta, x, dim):
    axis = wrap_dim(dim, x.ndim)
    x = x.astype(opmath(meta.dtype))
    if x.ndim == 0:
        return x.astype(meta.dtype)
    return fn(x, axis=axis).astype(meta.dtype)


@lowers(aten.cumsum.default)
def cumsum(meta, x, dim, *, dtype=None):
    return _scan(jnp.cumsum, meta, x, dim)


@lowers(aten.cumprod.default)
def cumprod(meta, x, dim, *, dtype=None):
    return _scan(jnp.cumprod, meta, x, dim)


def _cum_extreme(ge):
    """cummax/cummin: PyTorch keeps the *last* index of an extreme value, and a NaN, once
    seen, stays until the next NaN."""
    def combine(a, b):  # a: earlier segment's (value, index), b: later one's
        va, ia = a
        vb, ib = b
        take_b = jnp.isnan(vb) | (~jnp.isnan(va) & ge(vb, va))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    def lower(meta, x, dim):
        axis = wrap_dim(dim, x.ndim)
        if x.ndim == 0:
            return x.astype(meta[0].dtype), jnp.zeros((), meta[1].dtype)
        idx = lax.broadcasted_iota(meta[1].dtype, x.shape, axis)
        v, i = lax.associative_scan(combine, (x, idx), axis=axis)
        return v.astype(meta[0].dtype), i
    return lower


lowers(aten.cummax.default)(_cum_extreme(jnp.greater_equal))
lowers(aten.cummin.default)(_cum_extreme(jnp.less_equal))
