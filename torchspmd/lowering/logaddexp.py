"""``logaddexp`` and ``logcumsumexp``, real and complex -> JAX.

Real inputs use ``jnp.logaddexp`` / ``lax.cumlogsumexp``. For complex inputs the logarithm
has many values (imaginary parts 2*pi apart), and PyTorch picks one by its formula
``max + log1p(exp(min - max))`` (``max`` the operand of larger real part), which keeps
``max``'s imaginary part unwrapped; ``jnp.logaddexp`` wraps it into (-pi, pi]. So complex
inputs use PyTorch's formula, with its nan and infinity rules.

Example: ``torch.logaddexp(a.to("spmd"), b.to("spmd"))`` for complex ``a``, ``b`` lowers to
:func:`complex_logaddexp`.
"""

import jax.numpy as jnp
import torch
from jax import lax

from torchspmd.lowering._common import cast, is_complex, opmath, wrap_dim
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _has_nan(z):
    return jnp.isnan(jnp.real(z)) | jnp.isnan(jnp.imag(z))


def complex_logaddexp(x, y):
    """``log(exp(x) + exp(y))`` for complex arrays, as PyTorch's ``_log_add_exp_helper``."""
    x_smaller = jnp.real(x) < jnp.real(y)
    low, high = jnp.where(x_smaller, x, y), jnp.where(x_smaller, y, x)
    general = jnp.log1p(jnp.exp(low - high)) + high
    # Both real parts the same infinity: -inf gives that operand, +inf the plain formula.
    same_inf = ~jnp.isfinite(jnp.real(low)) & (jnp.real(low) == jnp.real(high))
    at_inf = jnp.where(jnp.real(low) < 0, low, jnp.log(jnp.exp(low) + jnp.exp(high)))
    value = jnp.where(same_inf, at_inf, general)
    # A nan anywhere is infectious (PyTorch's min/max pick the nan operand first).
    nan = jnp.asarray(complex(jnp.nan, jnp.nan), value.dtype)
    return jnp.where(_has_nan(x) | _has_nan(y), nan, value)


@lowers(aten.logaddexp.default)
def logaddexp(meta, a, b):
    dtype = opmath(meta.dtype)
    a, b = cast(a, dtype), cast(b, dtype)
    out = complex_logaddexp(a, b) if is_complex(dtype) else jnp.logaddexp(a, b)
    return out.astype(meta.dtype)


@lowers(aten.logcumsumexp.default)
def logcumsumexp(meta, x, dim):
    """Running ``logsumexp`` along ``dim``; complex values combine pairwise in a tree (the
    imaginary parts may then differ from PyTorch's left-to-right order by multiples of 2*pi)."""
    x = x.astype(opmath(meta.dtype))
    if x.ndim == 0:
        return x.astype(meta.dtype)
    axis = wrap_dim(dim, x.ndim)
    if is_complex(x.dtype):
        out = lax.associative_scan(complex_logaddexp, x, axis=axis)
    else:
        out = lax.cumlogsumexp(x, axis=axis)
    return out.astype(meta.dtype)
