"""Lowerings of random ops. Each takes ``key=``, a JAX PRNG key that is a graph input.

Values differ from PyTorch's generator; distributions, shapes and dtypes match. In-place
random ops arrive as their functional forms (``uniform_`` -> ``uniform``, ``normal_`` ->
``normal_functional``, ``bernoulli_(p)`` -> ``bernoulli.p``, ``random_`` -> ``random``...).
Floating samples are drawn in float32 (float64 for float64 results) and then cast.
``generator=`` arguments are ignored: the recorder owns the key.
"""

import jax
import jax.numpy as jnp
from jax import lax
from torch import ops

from torchspmd.lowering.registry import infers, lowers

aten = ops.aten


def _sample_dtype(dtype):
    """The dtype a float sample is drawn in before the cast to ``dtype``."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _uniform(key, meta, low=0.0, high=1.0):
    return jax.random.uniform(key, meta.shape, _sample_dtype(meta.dtype), low, high)


def _normal(key, meta):
    return jax.random.normal(key, meta.shape, _sample_dtype(meta.dtype))


def _integers(key, shape, low: int, high: int):
    """Uniform int64 integers in ``[low, high]`` (closed: any int64 range, full range included)."""
    bits = jax.random.bits(key, shape, jnp.uint64)
    span = high - low + 1
    offset = bits if span == 2**64 else bits % jnp.uint64(span)
    return jnp.int64(low) + lax.bitcast_convert_type(offset, jnp.int64)  # wraps modulo 2**64


# ---------------------------------------------------------------- continuous
@lowers(aten.uniform.default, random=True)
def uniform(meta, x, low=0.0, high=1.0, *, generator=None, key):
    return _uniform(key, meta, low, high).astype(meta.dtype)


@lowers(aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.rand_like.generator,
        random=True)
def rand(meta, *_args, key, **_kwargs):
    return _uniform(key, meta).astype(meta.dtype)


@lowers(aten.randn.default, aten.randn.generator, aten.randn_like.default, aten.randn_like.generator,
        random=True)
def randn(meta, *_args, key, **_kwargs):
    return _normal(key, meta).astype(meta.dtype)


@lowers(aten.normal_functional.default, random=True)
def normal_functional(meta, x, mean=0.0, std=1.0, *, generator=None, key):
    return (mean + std * _normal(key, meta)).astype(meta.dtype)


# normal.Tensor_float(mean, std), float_Tensor, Tensor_Tensor, float_float(mean, std, size):
# mean and std are tensors or static floats; both broadcast to meta's shape.
@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor,
        aten.normal.float_float, random=True)
def normal(meta, mean, std=1.0, *_size, key, **_kwargs):
    compute = _sample_dtype(meta.dtype)
    mean, std = jnp.asarray(mean).astype(compute), jnp.asarray(std).astype(compute)
    return (mean + std * _normal(key, meta)).astype(meta.dtype)


@lowers(aten.exponential.default, random=True)
def exponential(meta, x, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(key, meta.shape, _sample_dtype(meta.dtype)) / lambd).astype(meta.dtype)


@lowers(aten.cauchy.default, random=True)
def cauchy(meta, x, median=0.0, sigma=1.0, *, generator=None, key):
    sample = jax.random.cauchy(key, meta.shape, _sample_dtype(meta.dtype))
    return (median + sigma * sample).astype(meta.dtype)


@lowers(aten.log_normal.default, random=True)
def log_normal(meta, x, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(mean + std * _normal(key, meta)).astype(meta.dtype)


@infers(aten._standard_gamma.default)
def _like_alpha(alpha, generator=None):
    """PyTorch 2.11 has no meta kernel for it: one sample per ``alpha``."""
    return alpha.new_empty(alpha.shape)


@lowers(aten._standard_gamma.default, random=True)
def standard_gamma(meta, alpha, generator=None, *, key):
    compute = _sample_dtype(meta.dtype)
    return jax.random.gamma(key, alpha.astype(compute), meta.shape, compute).astype(meta.dtype)


# ---------------------------------------------------------------- discrete
@lowers(aten.bernoulli.default, random=True)
def bernoulli(meta, probs, *, generator=None, key):
    return jax.random.bernoulli(key, probs.astype(_sample_dtype(probs.dtype)), meta.shape).astype(meta.dtype)


@lowers(aten.bernoulli.p, aten.bernoulli.Tensor, random=True)
def bernoulli_p(meta, x, p, *, generator=None, key):
    p = jnp.asarray(p).astype(_sample_dtype(meta.dtype))
    return jax.random.bernoulli(key, p, meta.shape).astype(meta.dtype)


@lowers(aten.geometric.default, random=True)
def geometric(meta, x, p, *, generator=None, key):
    return jax.random.geometric(key, p, meta.shape, jnp.int64).astype(meta.dtype)


@lowers(aten.poisson.default, random=True)
def poisson(meta, rates, generator=None, *, key):
    return jax.random.poisson(key, rates.astype(jnp.float64), meta.shape, jnp.int64).astype(meta.dtype)



@lowers(aten.randint.default, aten.randint.generator, random=True)
def randint(meta, high, size, *, key, **_kwargs):
    return _integers(key, meta.shape, 0, high - 1).astype(meta.dtype)


@lowers(aten.randint.low, aten.randint.low_generator, random=True)
def randint_low(meta, low, high, size, *, key, **_kwargs):
    return _integers(key, meta.shape, low, high - 1).astype(meta.dtype)


@lowers(aten.randint_like.default, aten.randint_like.generator, random=True)
def randint_like(meta, x, high, *, key, **_kwargs):
    return _integers(key, meta.shape, 0, high - 1).astype(meta.dtype)


@lowers(aten.randint_like.Tensor, aten.randint_like.Tensor_generator, random=True)
def randint_like_tensor(meta, x, high, *, key, **_kwargs):
    """``high`` is a 0-d tensor here (a value, not a static bound)."""
    return jax.random.randint(key, meta.shape, 0, high.astype(jnp.int64), jnp.int64).astype(meta.dtype)


@lowers(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def randint_like_low(meta, x, low, high, *, key, **_kwargs):
    return _integers(key, meta.shape, low, high - 1).astype(meta.dtype)


def _random_bound(dtype) -> int:
    """``random_()``'s inclusive upper bound when ``to`` is not given (PyTorch's rule)."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


@lowers(aten.random.default, random=True)
def random_(meta, x, *, generator=None, key):
    return _integers(key, meta.shape, 0, _random_bound(meta.dtype)).astype(meta.dtype)


@lowers(aten.random.to, random=True)
def random_to(meta, x, to, *, generator=None, key):
    return _integers(key, meta.shape, 0, to - 1).astype(meta.dtype)


@lowers(getattr(aten.random, "from"), random=True)  # `from` is a Python keyword
def random_from(meta, x, low, to=None, *, generator=None, key):
    high = _random_bound(meta.dtype) if to is None else to - 1
    return _integers(key, meta.shape, low, high).astype(meta.dtype)


@lowers(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(meta, n, *, key, **_kwargs):
    return jax.random.permutation(key, n).astype(meta.dtype)


@lowers(aten.multinomial.default, random=True)
def multinomial(meta, probs, num_samples, replacement=False, *, generator=None, key):
    """With replacement: categorical draws. Without: the Gumbel top-k trick."""
    logits = jnp.log(probs.astype(_sample_dtype(probs.dtype)))
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples,) + logits.shape[:-1])
        return jnp.moveaxis(draws, 0, -1).astype(meta.dtype)
    perturbed = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
    return lax.top_k(perturbed, num_samples)[1].astype(meta.dtype)


# ---------------------------------------------------------------- dropout
@lowers(aten.native_dropout.default, random=True)
def native_dropout(meta, x, p, train, *, key):
    """(``x * mask / (1 - p)``, mask); ``train=False`` is the identity with an all-true mask."""
    if train is not None and not train:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return _masked_scale(x, keep, 0.0 if p == 1 else 1.0 / (1.0 - p)).astype(meta[0].dtype), keep


def _masked_scale(x, mask, scale: float):
    """``x * mask * scale`` as PyTorch computes it (half types in float32; inf * 0 is NaN).

    (``native_dropout_backward`` is lowered in nn.py.)
    """
    compute = _sample_dtype(x.dtype)
    return x.astype(compute) * mask.astype(compute) * jnp.asarray(scale, compute)
