"""Special functions whose ``jax.scipy.special`` version disagrees with PyTorch -> JAX.

- ``erfcx`` in float32: JAX computes ``exp(x^2) * erfc(x)``, and ``erfc`` of
  ``9.2 <= x <= 9.4`` is subnormal, flushed to zero on XLA: ``erfcx(9.25)`` came out 0
  instead of 0.0606. Above 9 the asymptotic series is exact to float32 precision.
- ``gammainc`` / ``gammaincc`` (``igamma`` / ``igammac``): PyTorch's boundary values
  (SciPy's) at ``a = 0``, ``x = 0`` and infinities, where JAX gives nan or other values.

Example: ``torch.special.erfcx(x.to("spmd"))`` lowers to :func:`erfcx`.
"""

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch

from torchspmd.lowering._common import cast, opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def erfcx(x):
    """``exp(x^2) * erfc(x)``, without the float32 underflow hole of ``jsp.erfcx``."""
    if x.dtype != np.float32:
        return jsp.erfcx(x)
    big = jnp.where(x > 9.0, x, 9.0)
    inv2 = 1.0 / (2.0 * big * big)
    # 1/(x sqrt(pi)) * sum_k (-1)^k (2k-1)!! / (2x^2)^k; the next term is below 1e-8.
    series = 1.0 - inv2 * (1.0 - 3.0 * inv2 * (1.0 - 5.0 * inv2 * (1.0 - 7.0 * inv2)))
    asymptotic = series / (big * math.sqrt(math.pi))
    return jnp.where(x > 9.0, asymptotic, jsp.erfcx(x))


def _incomplete_gamma(a, x, regular, at_a_zero, at_x_zero, at_a_inf, at_x_inf):
    """``regular`` outside PyTorch's boundary cases, whose values are the other arguments."""
    nan = jnp.nan
    out = jnp.where(jnp.isinf(x), at_x_inf, regular)
    out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, at_a_inf), out)
    out = jnp.where(x == 0, at_x_zero, out)
    out = jnp.where(a == 0, jnp.where(x > 0, at_a_zero, nan), out)
    return jnp.where((x < 0) | (a < 0), nan, out)


@lowers(aten.special_erfcx.default)
def erfcx_lowering(meta, x):
    return erfcx(x.astype(opmath(meta.dtype))).astype(meta.dtype)


@lowers(aten.igamma.default)
def igamma(meta, a, x):
    """Regularized lower incomplete gamma ``P(a, x)``."""
    dtype = opmath(meta.dtype)
    a, x = cast(a, dtype), cast(x, dtype)
    return _incomplete_gamma(a, x, jsp.gammainc(a, x), 1.0, 0.0, 0.0, 1.0).astype(meta.dtype)


@lowers(aten.igammac.default)
def igammac(meta, a, x):
    """Regularized upper incomplete gamma ``Q(a, x) = 1 - P(a, x)``."""
    dtype = opmath(meta.dtype)
    a, x = cast(a, dtype), cast(x, dtype)
    return _incomplete_gamma(a, x, jsp.gammaincc(a, x), 0.0, 1.0, 1.0, 0.0).astype(meta.dtype)
