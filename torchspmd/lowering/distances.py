"""Pairwise distances: ``cdist`` and ``pdist`` (``_cdist_forward``, ``_pdist_forward``) and
their backward ops, as PyTorch defines them.

A p-norm distance of rows: ``p == 0`` counts differing coordinates, ``p == inf`` is the
largest difference. The Euclidean case may use the matrix-multiply form
(``|a|² + |b|² - 2 a·b``), as PyTorch does when ``compute_mode`` asks for it or, by
default, when either side has more than 25 rows. Gradients are 0 where a distance is 0
(PyTorch's convention; the norm has no derivative there).

``p`` arrives as a static float that compares equal only to floats of its own kind (the
recorder's cache keys), so each lowering turns it into a plain ``float`` first.
"""

import math

import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import compute_in_opmath as _f
from torchspmd.lowering.registry import lowers

aten = ops.aten

_USE_MM, _NEVER_MM = 1, 2  # compute_mode: None (the default), 1 or 2


def _differences(x1, x2):
    """``x1[..., i, :] - x2[..., j, :]`` for every pair: shape (..., P, R, M)."""
    return x1[..., :, None, :] - x2[..., None, :, :]


def _p_distance(diff, p: float):
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum(a != 0, axis=-1).astype(diff.dtype)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0)
    return jnp.sum(a ** p, axis=-1) ** (1 / p)


def _euclid_by_mm(x1, x2):
    sq = jnp.sum(x1 * x1, -1)[..., :, None] + jnp.sum(x2 * x2, -1)[..., None, :]
    return jnp.sqrt(jnp.maximum(sq - 2 * jnp.matmul(x1, jnp.swapaxes(x2, -1, -2)), 0))


@lowers(aten._cdist_forward.default)
def cdist_forward(meta, x1, x2, p, compute_mode=None):
    a, b, p = _f(x1, meta), _f(x2, meta), float(p)
    rows = max(a.shape[-2], b.shape[-2])
    use_mm = compute_mode == _USE_MM or (compute_mode is None and rows > 25)
    if p == 2 and use_mm and compute_mode != _NEVER_MM:
        out = _euclid_by_mm(a, b)
    else:
        out = _p_distance(_differences(a, b), p)
    return jnp.broadcast_to(out, meta.shape).astype(meta.dtype)


def _distance_grad(grad, diff, dist, p: float):
    """d(dist)/d(x1) weighted by ``grad``, per pair: shape (..., P, R, M)."""
    g, d = grad[..., None], dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return g * jnp.sign(diff)
    if math.isinf(p):
        return jnp.where(jnp.abs(diff) == d, g * jnp.sign(diff), zero)
    safe = jnp.where(d == 0, jnp.ones((), d.dtype), d)
    if p == 2:
        return jnp.where(d == 0, zero, g * diff / safe)
    a = jnp.abs(diff)
    if p < 1:  # |diff|^(p-1) is infinite at 0: PyTorch gives 0 there
        value = jnp.sign(diff) * jnp.where(a == 0, zero, a) ** (p - 1) * g / safe ** (p - 1)
        return jnp.where((d == 0) | (a == 0), zero, value)
    return jnp.where(d == 0, zero, diff * a ** (p - 2) * g / safe ** (p - 1))


def _sum_to(x, shape):
    """``x`` summed over the leading dims broadcasting added to reach ``shape``."""
    lead = x.ndim - len(shape)
    x = jnp.sum(x, axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


@lowers(aten._cdist_backward.default)
def cdist_backward(meta, grad, x1, x2, p, cdist):
    a, b, p = _f(x1, meta), _f(x2, meta), float(p)
    diff = _differences(a, b)
    per_pair = _distance_grad(_f(grad, meta), diff, _f(cdist, meta), p)
    return _sum_to(jnp.sum(per_pair, axis=-2), meta.shape).astype(meta.dtype)


def _pairs(n: int):
    """Row and column of each pair ``i < j`` in ``pdist``'s (row-major) order."""
    return jnp.triu_indices(n, k=1)


@lowers(aten._pdist_forward.default)
def pdist_forward(meta, x, p=2):
    a, p = _f(x, meta), float(p)
    i, j = _pairs(a.shape[0])
    return _p_distance(a[i] - a[j], p).astype(meta.dtype)


@lowers(aten._pdist_backward.default)
def pdist_backward(meta, grad, x, p, pdist):
    a, p = _f(x, meta), float(p)
    n = a.shape[0]
    i, j = _pairs(n)
    per_pair = _distance_grad(_f(grad, meta), a[i] - a[j], _f(pdist, meta), p)  # (K, M)
    out = jnp.zeros(a.shape, a.dtype).at[i].add(per_pair).at[j].add(-per_pair)
    return out.astype(meta.dtype)
