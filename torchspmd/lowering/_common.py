"""Small helpers shared by the lowering families (stable: other families import these).

- :func:`cast` turns a tensor *or* a Scalar argument (Python number or 0-d traced array)
  into a JAX array of a given dtype.
- ``opmath`` (from ``dtypes``) is the dtype PyTorch computes in on CPU (float32 for
  bfloat16/float16).
- :func:`wrap_dim` / :func:`reduction_axes` normalize ``dim`` arguments.
- :func:`result_type` is PyTorch's type promotion (tensors, 0-d tensors, Python scalars),
  for the few ops whose compute dtype is not their result dtype (comparisons).
- :func:`centered_sums` is what every variance and normalization is computed from.
"""

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from torchspmd.lowering.dtypes import opmath, to_jax_dtype  # noqa: F401  (opmath: for the families)


def cast(value, dtype) -> jnp.ndarray:
    """``value`` (jax array, Python number, or 0-d traced Scalar) as an array of ``dtype``.

    Example: ``cast(0.5, jnp.float32)``; ``cast(x, meta.dtype)``.
    """
    return jnp.asarray(value, dtype=dtype)


def is_floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def wrap_dim(dim: int, ndim: int) -> int:
    """A possibly negative ``dim`` as an axis in ``range(ndim)``; 0-d tensors accept 0 and -1."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"torchspmd: dim {dim} out of range for a {ndim}-d tensor")
    return 0 if ndim == 0 else dim % n


def reduction_axes(dim, ndim: int, empty_means_all: bool = True) -> tuple[int, ...]:
    """Axes a reduction runs over: ``None`` (and ``[]`` where ``empty_means_all``) means all.

    ``dim`` may be an int or a sequence of ints. 0-d tensors reduce over nothing.
    """
    if dim is None or (empty_means_all and isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if ndim == 0:
        for d in dims:
            wrap_dim(d, 0)
        return ()
    return tuple(sorted({wrap_dim(d, ndim) for d in dims}))


def default_float_dtype() -> np.dtype:
    """The JAX dtype of ``torch.get_default_dtype()`` (what a Python float promotes to)."""
    return to_jax_dtype(torch.get_default_dtype())


def _category(dtype) -> int:
    if np.dtype(dtype) == np.bool_:
        return 0
    if jnp.issubdtype(dtype, jnp.integer):
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2
    return 3


def _scalar_category(value) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return 1
    if isinstance(value, float):
        return 2
    if isinstance(value, complex):
        return 3
    return _category(jnp.asarray(value).dtype)


def _promote_all(dtypes):
    out = dtypes[0]
    for d in dtypes[1:]:
        out = jnp.promote_types(out, d)
    return np.dtype(out)


def result_type(*tensors, scalars=()) -> np.dtype:
    """PyTorch's ``torch.result_type`` for tensor operands and Scalar operands.

    ``tensors`` are jax arrays (0-d ones count as zero-dim tensors, which only decide the
    dtype when their category is higher); ``scalars`` are Scalar arguments (Python numbers
    or 0-d traced arrays), which only contribute their category (bool < int < float <
    complex), giving the default dtype of that category when it is the highest.
    Example: ``result_type(int32_array, scalars=(2.5,)) == float32``.
    """
    dim = [np.dtype(t.dtype) for t in tensors if jnp.ndim(t) > 0]
    zero = [np.dtype(t.dtype) for t in tensors if jnp.ndim(t) == 0]
    out = _promote_all(dim) if dim else None
    if zero:
        z = _promote_all(zero)
        if out is None or _category(z) > _category(out):
            out = z
    if scalars:
        cat = max(_scalar_category(s) for s in scalars)
        if out is None or cat > _category(out):
            if cat == 0:
                out = np.dtype(np.bool_)
            elif cat == 1:
                out = np.dtype(np.int64)
            elif cat == 2:
                # A float Scalar over a complex tensor is impossible here (cat would not be higher).
                out = default_float_dtype()
            else:
                f = default_float_dtype() if out is None or not is_floating(out) else out
                out = np.dtype(jnp.complex128 if f == np.float64 else jnp.complex64)
    return out


def compute_in_opmath(x, meta):
    """``x`` in the compute dtype of an op whose result is ``meta`` (float32 for half types)."""
    return x.astype(opmath(meta.dtype))


def outputs_like_meta(meta, values):
    """Cast multi-output ``values`` to ``meta``; ``None`` where meta is ``None`` (output_mask).

    An output the meta kernel makes empty (batch norm's eval statistics, fused attention's
    unrequested weights) is returned empty whatever was computed for it.
    """
    return tuple(None if m is None else jnp.zeros(m.shape, m.dtype) if 0 in m.shape
                 else jnp.broadcast_to(v, m.shape).astype(m.dtype) for m, v in zip(meta, values))


def centered_sums(x, axes: tuple[int, ...]):
    """``(mean, s)`` of real ``x`` over ``axes``: its mean (axes kept) and the sum of the
    squared deviations from it (axes dropped), in the corrected two-pass form.

    The first mean's rounding error ``e`` adds ``n * e**2`` to the sum of squares, which
    the sum of the deviations (``n * e``) takes back out, and corrects the mean too
    (float32 data with mean 1e4 and std 0.1 had its variance 1e-4 off, relatively,
    without it; CPU PyTorch accumulates in float64). One variadic reduce for both sums:
    XLA makes it one fusion, fewer than the mean of squares alone. ``s`` is never
    negative (rounding could leave a constant input's ``-tiny``: its std is 0).

    Example: ``mean, s = centered_sums(x, (1,)); var = s / (x.shape[1] - 1)``.
    """
    n = reduced_count(x.shape, axes)
    mean = jnp.mean(x, axes, keepdims=True)
    dev = x - mean
    zero = jnp.zeros((), dev.dtype)
    d, s = lax.reduce((dev, dev * dev), (zero, zero), _add_pairs, axes)
    return mean + jnp.expand_dims(d / n, axes), jnp.maximum(s - d * d / n, 0)


def _add_pairs(a, b):
    return a[0] + b[0], a[1] + b[1]


def reduced_count(shape, axes: tuple[int, ...]) -> int:
    """How many elements a reduction over ``axes`` of ``shape`` folds into one."""
    return math.prod(shape[a] for a in axes)
