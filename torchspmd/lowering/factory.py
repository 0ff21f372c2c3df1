"""Lowerings of factory ops (``full``, ``arange``, ``eye``...), ``*_like`` / ``new_*`` ops,
and the whole-tensor writes ``fill``, ``zero`` and ``copy``.

Shape and dtype come from ``meta`` (the ``dtype``/``layout``/``device``/``pin_memory``/
``memory_format`` keywords are already reflected there and are ignored). Uninitialized
memory does not exist in a JAX program: ``empty*`` produce zeros.
"""

import jax.numpy as jnp
from jax.scipy.special import i0
import numpy as np
from torch import ops

from torchspmd.lowering._common import cast, opmath
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _full(meta, value):
    """``meta``-shaped array of ``value`` (a Python number or a 0-d, possibly traced, array)."""
    return jnp.full(meta.shape, cast(value, meta.dtype), meta.dtype)


# ---------------------------------------------------------------- constant fills
@lowers(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default,
        aten.empty_permuted.default, aten.zeros_like.default, aten.empty_like.default,
        aten.new_zeros.default, aten.new_empty.default, aten.new_empty_strided.default,
        aten.zero.default, aten._efficientzerotensor.default)  # (last: torch.func's hessian)
def zeros(meta, *_args, **_kwargs):
    return jnp.zeros(meta.shape, meta.dtype)


@lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(meta, *_args, **_kwargs):
    return jnp.ones(meta.shape, meta.dtype)


@lowers(aten.full.default)
def full(meta, size, fill_value, **_kwargs):
    return _full(meta, fill_value)


@lowers(aten.scalar_tensor.default)
def scalar_tensor(meta, s, **_kwargs):
    return _full(meta, s)


# full_like(self, v), new_full(self, size, v), fill.Scalar(self, v), fill.Tensor(self, v):
# the value is the last positional argument.
@lowers(aten.full_like.default, aten.new_full.default, aten.fill.Scalar, aten.fill.Tensor)
def full_like(meta, *args, **_kwargs):
    return _full(meta, args[-1])


@lowers(aten.copy.default)
def copy(meta, x, src, non_blocking=False):
    """``x.copy_(src)`` as a value: ``src`` broadcast to ``x``'s shape, in ``x``'s dtype."""
    return jnp.broadcast_to(src.astype(meta.dtype), meta.shape)


# ---------------------------------------------------------------- ranges
def _arange(meta, start, step):
    """``start + i * step``: in int64 for integer results, else in float64 (as PyTorch's
    CPU kernel accumulates in double), then cast."""
    compute = jnp.int64 if jnp.issubdtype(meta.dtype, jnp.integer) else jnp.float64
    i = jnp.arange(meta.shape[0], dtype=compute)
    return (jnp.asarray(start).astype(compute) + i * jnp.asarray(step).astype(compute)).astype(meta.dtype)


@lowers(aten.arange.default)
def arange(meta, end, **_kwargs):
    return _arange(meta, 0, 1)


@lowers(aten.arange.start)
def arange_start(meta, start, end, **_kwargs):
    return _arange(meta, start, 1)


@lowers(aten.arange.start_step)
def arange_start_step(meta, start, end, step=1, **_kwargs):
    return _arange(meta, start, step)


@lowers(aten.range.step, aten.range.default)
def range_(meta, start, end, step=1, **_kwargs):
    """``torch.range`` (deprecated, ``end`` included): its length comes with ``meta``."""
    return _arange(meta, start, step)


def _linspace(meta, start, end, steps: int):
    """PyTorch's symmetric linspace: the first half steps up from ``start``, the second half
    down from ``end``, in float64. Integer results take integer ``start``/``end`` first."""
    is_int = jnp.issubdtype(meta.dtype, jnp.integer)
    start, end = (jnp.asarray(v).astype(jnp.int64 if is_int else jnp.float64).astype(jnp.float64)
                  for v in (start, end))
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=jnp.float64)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@lowers(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
        aten.linspace.Scalar_Tensor)
def linspace(meta, start, end, steps, **_kwargs):
    return _linspace(meta, start, end, steps).astype(meta.dtype)


@lowers(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
        aten.logspace.Scalar_Tensor)
def logspace(meta, start, end, steps, base=10.0, **_kwargs):
    return jnp.power(jnp.float64(base), _linspace(meta, start, end, steps)).astype(meta.dtype)


@lowers(aten.eye.default)
def eye(meta, n, **_kwargs):
    return jnp.eye(n, dtype=meta.dtype)


@lowers(aten.eye.m)
def eye_m(meta, n, m, **_kwargs):
    return jnp.eye(n, m, dtype=meta.dtype)


@lowers(aten.tril_indices.default)
def tril_indices(meta, row, col, offset=0, **_kwargs):
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)).reshape(meta.shape), meta.dtype)


@lowers(aten.triu_indices.default)
def triu_indices(meta, row, col, offset=0, **_kwargs):
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)).reshape(meta.shape), meta.dtype)


# ---------------------------------------------------------------- windows
@lowers(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def kaiser_window(meta, window_length, periodic=True, beta=12.0, **_kwargs):
    """PyTorch's Kaiser window, ``I0(beta * sqrt(1 - ((n - a) / a)^2)) / I0(beta)`` with
    ``a = (N - 1) / 2`` over one more point when periodic, in float64. (PyTorch computes
    it in a CPU kernel its other windows do not need: without this lowering it reached
    PyTorch's dispatch stub, which has no spmd kernel, as an internal assertion.)"""
    n = window_length + (1 if periodic and window_length > 1 else 0)
    if n <= 1:
        return jnp.ones((n,), meta.dtype)
    a = (n - 1) / 2.0
    ratio = (jnp.arange(n, dtype=jnp.float64) - a) / a
    window = i0(beta * jnp.sqrt(jnp.abs(1 - ratio * ratio))) / i0(jnp.float64(beta))
    return window[: meta.shape[0]].astype(meta.dtype)


# ---------------------------------------------------------------- FFT sample frequencies
def _frequencies(meta, index, n: int, d: float):
    """``index / (d * n)`` as PyTorch computes it (multiplied by ``1 / (n * d)`` in the
    result's compute type). Lowered because PyTorch writes the negative half in place
    into a slice of a new tensor, which an spmd tensor without storage refused."""
    compute = opmath(meta.dtype)
    return (index.astype(compute) * jnp.asarray(1.0 / (n * d), compute)).astype(meta.dtype)


@lowers(aten.fft_fftfreq.default)
def fft_fftfreq(meta, n, d=1.0, **_kwargs):
    index = jnp.concatenate([jnp.arange((n + 1) // 2), jnp.arange(-(n // 2), 0)])
    return _frequencies(meta, index, n, d)


@lowers(aten.fft_rfftfreq.default)
def fft_rfftfreq(meta, n, d=1.0, **_kwargs):
    return _frequencies(meta, jnp.arange(n // 2 + 1), n, d)
