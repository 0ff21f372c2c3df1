"""Orthogonal polynomials of ``torch.special`` (Chebyshev T/U/V/W and their shifted forms,
Hermite H/He, Laguerre L, Legendre P) -> JAX.

``p(x, n)`` takes the degree ``n`` per element (a tensor or a Scalar, truncated to an
integer; a negative, inf or nan degree gives 0). As in PyTorch's CPU kernels
(``ATen/native/Math.h``), values at the interval ends are exact, Chebyshev polynomials of
high degree inside ``(-1, 1)`` use their trigonometric form, and everything else runs the
three-term recurrence, here a ``lax.while_loop`` up to the largest degree that needs it
(stopping early once every such element is nan).

Example: ``torch.special.legendre_polynomial_p(x.to("spmd"), 3)`` lowers to
``legendre_p(x, 3)``.
"""

import jax.numpy as jnp
import torch
from jax import lax

from torchspmd.lowering._common import opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _recurrence(x, n, p1, step):
    """``p_n(x)`` with ``p_0 = 1``, ``p_1 = p1``, ``p_m = step(m, x, p_{m-1}, p_{m-2})``.

    Elements whose ``n`` is below 2 get ``1`` or ``p1``; the loop runs to the largest ``n``.
    """
    shape = jnp.broadcast_shapes(x.shape, n.shape)
    x, n = jnp.broadcast_to(x, shape), jnp.broadcast_to(n, shape)
    p1 = jnp.broadcast_to(p1, shape).astype(x.dtype)
    last = jnp.max(n, initial=1)

    def more(carry):
        m, _, q = carry
        return (m <= last) & jnp.any((m <= n) & ~jnp.isnan(q))

    def next_degree(carry):
        m, p, q = carry
        r = step(m.astype(x.dtype), x, q, p)
        active = m <= n
        return m + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    start = (jnp.asarray(2, n.dtype), jnp.ones(shape, x.dtype), p1)
    _, _, q = lax.while_loop(more, next_degree, start)
    return jnp.where(n == 0, jnp.ones_like(q), q)


def _chebyshev_step(m, y, q, p):
    return (y + y) * q - p


def _even(n):
    return n % 2 == 0


def _odd_sign(n, value):
    """``value`` for even ``n``, ``-value`` for odd ``n``."""
    return jnp.where(_even(n), value, -value)


def _chebyshev(y, n, kind: str, trig_from: int, at_one, at_minus_one, trig_fallback):
    """A Chebyshev polynomial of ``kind`` at ``y`` (already shifted where needed).

    ``at_one`` / ``at_minus_one`` are its exact values at the ends; ``trig_fallback`` the
    value where the trigonometric form divides by zero.
    """
    nf = n.astype(y.dtype)
    theta = jnp.arccos(jnp.clip(y, -1.0, 1.0))
    if kind == "t":
        trig, singular = jnp.cos(nf * theta), jnp.zeros_like(y, dtype=bool)
        p1 = y
    elif kind == "u":
        singular = jnp.sin(theta) == 0
        trig = jnp.sin((nf + 1) * theta) / jnp.sin(theta)
        p1 = y + y
    elif kind == "v":
        singular = jnp.sin(theta / 2) == 1
        trig = jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2)
        p1 = y + y - 1.0
    else:
        singular = jnp.cos(theta / 2) == 1
        trig = jnp.sin((nf + 0.5) * theta) / jnp.sin(theta / 2)
        p1 = y + y + 1.0
    use_trig = (n > trig_from) & (jnp.abs(y) < 1.0)
    trig = jnp.where(singular, trig_fallback(nf, theta), trig)
    recurrence = _recurrence(y, jnp.where(use_trig, 0, n), p1, _chebyshev_step)
    value = jnp.where(use_trig, trig, recurrence)
    return value, at_one(nf), at_minus_one(nf)


def _chebyshev_lowering(kind: str, shifted: bool):
    """``chebyshev_polynomial_{kind}`` or ``shifted_chebyshev_polynomial_{kind}`` of ``(x, n)``."""
    at_one = {"t": lambda n: jnp.ones_like(n), "u": lambda n: n + 1,
              "v": lambda n: jnp.ones_like(n), "w": lambda n: n + n + 1}[kind]
    at_minus_one = {"t": lambda n: _odd_sign(n, jnp.ones_like(n)),
                    "u": lambda n: _odd_sign(n, n + 1),
                    "v": lambda n: _odd_sign(n, n + n + 1),
                    "w": lambda n: _odd_sign(n, jnp.ones_like(n))}[kind]
    trig_from = (4 if kind == "w" else 6) if shifted else (6 if kind == "t" else 8)

    def polynomial(x, n):
        y = x + x - 1.0 if shifted else x

        def fallback(nf, theta):
            if kind == "u":
                return (nf + 1) * jnp.cos((nf + 1) * theta) / y
            if kind == "v":
                return _odd_sign(nf, nf + nf + 1)
            if shifted:
                return _odd_sign(nf, jnp.ones_like(nf))
            return jnp.where(x > 0, nf + nf + 1, _odd_sign(nf, jnp.ones_like(nf)))

        value, one, minus_one = _chebyshev(y, n, kind, trig_from, at_one, at_minus_one, fallback)
        # The ends of the interval, tested on x as PyTorch does (y = -1 also for tiny x).
        at_end, at_start = (x == 1.0, x == 0.0) if shifted else (x == 1.0, x == -1.0)
        value = jnp.where(at_end, one, jnp.where(at_start, minus_one, value))
        return jnp.where(n < 0, 0.0, value)

    return polynomial


def _hermite_h(x, n):
    limit = 128 if x.dtype == jnp.float32 else 512  # PyTorch: nan above these degrees
    value = _recurrence(x, jnp.where(n > limit, 0, n), x + x,
                        lambda m, x, q, p: (x + x) * q - (m + m - 2) * p)
    return jnp.where(n < 0, 0.0, jnp.where(n > limit, jnp.nan, value))


def _hermite_he(x, n):
    limit = 128 if x.dtype == jnp.float32 else 512
    value = _recurrence(x, jnp.where(n > limit, 0, n), x, lambda m, x, q, p: x * q - (m - 1) * p)
    return jnp.where(n < 0, 0.0, jnp.where(n > limit, jnp.nan, value))


def _laguerre_l(x, n):
    value = _recurrence(x, jnp.where(x == 0, 0, n), 1.0 - x,
                        lambda m, x, q, p: ((m + m - 1 - x) * q - (m - 1) * p) / m)
    return jnp.where(n < 0, 0.0, jnp.where(x == 0, 1.0, value))


def _legendre_p(x, n):
    value = _recurrence(x, jnp.where(jnp.abs(x) == 1, 0, n), x,
                        lambda m, x, q, p: ((m + m - 1) * x * q - (m - 1) * p) / m)
    ends = jnp.where((x > 0) | _even(n), 1.0, -1.0)
    return jnp.where(n < 0, 0.0, jnp.where(jnp.abs(x) == 1, ends, value))


def _degree(n):
    """PyTorch's ``static_cast<int64_t>(n)``: truncation; inf and nan become -1 (so 0)."""
    n = jnp.asarray(n)
    if jnp.issubdtype(n.dtype, jnp.floating):
        return jnp.where(jnp.isfinite(n), jnp.trunc(n), -1).astype(jnp.int64)
    return n.astype(jnp.int64)


def _register(name: str, fn):
    packet = getattr(aten, f"special_{name}")

    def lower(meta, x, n):
        dtype = opmath(meta.dtype)
        return fn(jnp.asarray(x).astype(dtype), _degree(n)).astype(meta.dtype)

    lower.__name__ = name
    lowers(packet.default, packet.x_scalar, packet.n_scalar)(lower)


for _kind in "tuvw":
    _register(f"chebyshev_polynomial_{_kind}", _chebyshev_lowering(_kind, shifted=False))
    _register(f"shifted_chebyshev_polynomial_{_kind}", _chebyshev_lowering(_kind, shifted=True))
_register("hermite_polynomial_h", _hermite_h)
_register("hermite_polynomial_he", _hermite_he)
_register("laguerre_polynomial_l", _laguerre_l)
_register("legendre_polynomial_p", _legendre_p)
