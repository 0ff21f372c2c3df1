"""The Hurwitz zeta function and the polygamma functions built on it -> JAX.

``jax.scipy.special.zeta`` (and so ``polygamma``) loses all accuracy for a negative ``q``
(``polygamma(1, -8.48)`` is off by 20%), so this follows PyTorch's CPU kernels
(``ATen/native/Math.h``, from Cephes): the series summed term by term until
``q + i > 9``, then the Euler-Maclaurin tail; ``trigamma`` by its own reflection and
asymptotic series.

Example: ``torch.polygamma(2, x.to("spmd"))`` lowers to :func:`polygamma` with ``n=2``.
"""

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torchspmd.lowering._common import cast, opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten

# Euler-Maclaurin denominators (2k)! / B_2k, as in Cephes.
_EULER_MACLAURIN = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
                    7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
                    -4.5979787224074726105e15, 1.8152105401943546773e17,
                    -7.1661652561756670113e18)


def _epsilon(dtype) -> float:
    """Cephes' MACHEP (half an ulp of 1) for ``dtype``."""
    return float(np.finfo(dtype).eps) / 2


def hurwitz_zeta(x, q):
    """``sum_{k >= 0} (k + q) ** -x`` for ``x > 1``; inf at ``x == 1`` and at poles ``q = 0,
    -1, ...``; nan for ``x < 1`` and for a non-integer ``x`` with ``q < 0``."""
    x, q = jnp.broadcast_arrays(x, q)
    eps = _epsilon(x.dtype)

    def running(i, converged):
        return ~converged & ((i < 9) | (q + i.astype(q.dtype) <= 9.0))

    def more(carry):
        i, _, _, _, converged = carry
        return jnp.any(running(i, converged))

    def add_term(carry):
        i, s, last, w, converged = carry
        go = running(i, converged)
        a = q + (i + 1).astype(q.dtype)
        b = a ** -x
        s_next = s + b
        converged = converged | (go & (-eps * s_next < b) & (b < eps * s_next))
        return (i + 1, jnp.where(go, s_next, s), jnp.where(go, b, last), jnp.where(go, a, w),
                converged)

    pole = (q <= 0) & (q == jnp.floor(q))  # -inf too: it must not enter the loop
    undefined = (x <= 1.0) | jnp.isnan(x) | jnp.isnan(q) | ((q <= 0) & (x != jnp.floor(x)))
    first = jnp.where(jnp.isnan(x), jnp.nan, q ** -x)  # 1 ** nan is 1, but the sum is nan
    start = (jnp.asarray(0, jnp.int64), first, jnp.zeros_like(x), q, pole | undefined)
    _, s, b, w, done = lax.while_loop(more, add_term, start)

    # Euler-Maclaurin tail from w = q + i on, for the elements the sum did not finish.
    s = jnp.where(done, s, s + b * w / (x - 1.0) - 0.5 * b)
    a, k = jnp.ones_like(x), 0.0
    for denominator in _EULER_MACLAURIN:
        a = a * (x + k)
        b = b / w
        t = a * b / denominator
        s_next = s + t
        s, done = jnp.where(done, s, s_next), done | (jnp.abs(t / s_next) < eps)
        k += 1.0
        a = a * (x + k)
        b = b / w
        k += 1.0

    s = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, s)
    s = jnp.where(pole, jnp.inf, s)  # checked first by PyTorch, so it wins over nan
    return jnp.where(x == 1.0, jnp.inf, jnp.where(x < 1.0, jnp.nan, s))


def digamma(x):
    """PyTorch's digamma: ``-inf`` / ``inf`` at ``+0`` / ``-0`` (JAX gives nan)."""
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), lax.digamma(x))


def trigamma(x):
    """PyTorch's trigamma: reflection below 1/2, six recurrence steps, asymptotic series."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    result = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), 0.0)
    x = jnp.where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (x * x)
        x = x + 1.0
    ixx = 1.0 / (x * x)
    result = result + (1.0 + 1.0 / (2.0 * x)
                       + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(reflect, -result, result)


def polygamma(n: int, x):
    """The ``n``-th derivative of digamma: ``(-1)^(n+1) n! zeta(n + 1, x)`` for ``n >= 2``."""
    if n < 0:
        raise ValueError(f"torchspmd: polygamma(n, x) needs n >= 0, got n = {n}")
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.factorial(n) * hurwitz_zeta(jnp.full_like(x, n + 1.0), x)


@lowers(aten.polygamma.default)
def polygamma_lowering(meta, n, x):
    return polygamma(n, x.astype(opmath(meta.dtype))).astype(meta.dtype)


@lowers(aten.special_zeta.default, aten.special_zeta.other_scalar, aten.special_zeta.self_scalar)
def zeta_lowering(meta, x, q):
    dtype = opmath(meta.dtype)
    return hurwitz_zeta(cast(x, dtype), cast(q, dtype)).astype(meta.dtype)
