"""Random lowerings: shapes, dtypes, support and sample statistics (not PyTorch's values)."""

import math

import jax
import pytest
import torch

from tests.lowering.helpers import run_lowering
from torchspmd.lowering.registry import RANDOM_OPS

aten = torch.ops.aten
T = torch.tensor
N = 20000
f32, f64, i64, bf16 = torch.float32, torch.float64, torch.int64, torch.bfloat16
x = torch.empty(N)
xi = torch.empty(N, dtype=i64)


def full(v, dtype=f32):
    return torch.full((N,), v, dtype=dtype)


# name: (op, args, kwargs, expected mean, expected std, inclusive support (lo, hi) or None)
CASES = {
    "uniform": (aten.uniform.default, (x, 2.0, 5.0), {}, 3.5, 3 / math.sqrt(12), (2, 5)),
    "uniform_f64": (aten.uniform.default, (x.double(),), {}, 0.5, 1 / math.sqrt(12), (0, 1)),
    "rand": (aten.rand.default, ([100, N // 100],), {}, 0.5, 1 / math.sqrt(12), (0, 1)),
    "rand_bf16": (aten.rand.default, ([N],), {"dtype": bf16}, 0.5, 1 / math.sqrt(12), (0, 1)),
    "rand_generator": (aten.rand.generator, ([N],), {"generator": None}, 0.5, 1 / math.sqrt(12), (0, 1)),
    "rand_like": (aten.rand_like.default, (xi,), {"dtype": f64}, 0.5, 1 / math.sqrt(12), (0, 1)),
    "randn": (aten.randn.default, ([N],), {}, 0.0, 1.0, None),
    "randn_like": (aten.randn_like.default, (x.bfloat16(),), {}, 0.0, 1.0, None),
    "normal_functional": (aten.normal_functional.default, (x, 3.0, 2.0), {}, 3.0, 2.0, None),
    "normal_tensor_float": (aten.normal.Tensor_float, (full(5.0), 0.5), {}, 5.0, 0.5, None),
    "normal_float_tensor": (aten.normal.float_Tensor, (-1.0, full(3.0, f64)), {}, -1.0, 3.0, None),
    "normal_tensor_tensor": (aten.normal.Tensor_Tensor, (full(2.0), T(0.1)), {}, 2.0, 0.1, None),
    "normal_float_float": (aten.normal.float_float, (1.0, 2.0, [N]), {}, 1.0, 2.0, None),
    "exponential": (aten.exponential.default, (x, 2.0), {}, 0.5, 0.5, (0, math.inf)),
    "log_normal": (aten.log_normal.default, (x, 0.0, 0.25), {}, math.exp(0.25**2 / 2),
                   math.sqrt((math.exp(0.25**2) - 1) * math.exp(0.25**2)), (0, math.inf)),
    "standard_gamma": (aten._standard_gamma.default, (full(3.0),), {}, 3.0, math.sqrt(3.0), (0, math.inf)),
    "bernoulli": (aten.bernoulli.default, (full(0.3),), {}, 0.3, math.sqrt(0.21), (0, 1)),
    "bernoulli_p": (aten.bernoulli.p, (x, 0.7), {}, 0.7, math.sqrt(0.21), (0, 1)),
    "bernoulli_tensor": (aten.bernoulli.Tensor, (xi, T(0.2)), {}, 0.2, 0.4, (0, 1)),
    "geometric": (aten.geometric.default, (x, 0.25), {}, 4.0, math.sqrt(0.75) / 0.25, (1, math.inf)),
    "poisson": (aten.poisson.default, (full(4.0),), {}, 4.0, 2.0, (0, math.inf)),
    "randint": (aten.randint.default, (10, [N]), {}, 4.5, math.sqrt(99 / 12), (0, 9)),
    "randint_low": (aten.randint.low, (-5, 5, [N]), {"dtype": f32}, -0.5, math.sqrt(99 / 12), (-5, 4)),
    "randint_like": (aten.randint_like.default, (x, 4), {}, 1.5, math.sqrt(15 / 12), (0, 3)),
    "randint_like_tensor": (aten.randint_like.Tensor, (xi, T(4)), {}, 1.5, math.sqrt(15 / 12), (0, 3)),
    "randint_like_low": (aten.randint_like.low_dtype, (xi, 10, 14), {}, 11.5, math.sqrt(15 / 12), (10, 13)),
    "random_to": (aten.random.to, (x, 3), {}, 1.0, math.sqrt(8 / 12), (0, 2)),
    "random_from": (getattr(aten.random, "from"), (xi, -3, 3), {}, -0.5, math.sqrt(35 / 12), (-3, 2)),
    "random_from_to_none": (getattr(aten.random, "from"), (torch.empty(N, dtype=torch.int8), 100, None),
                            {}, 113.5, math.sqrt((28**2 - 1) / 12), (100, 127)),
    "random_bool": (aten.random.default, (torch.empty(N, dtype=torch.bool),), {}, 0.5, 0.5, (0, 1)),
    "random_bf16": (aten.random.default, (x.bfloat16(),), {}, 128, 256 / math.sqrt(12), (0, 256)),
}


def _check_stats(out, mean, std, support):
    v = out.double()
    assert abs(v.mean().item() - mean) < 0.05 * std + 1e-3, (v.mean(), mean)
    assert abs(v.std().item() - std) < 0.05 * std, (v.std(), std)
    if support is not None:
        assert v.min() >= support[0] and v.max() <= support[1], (v.min(), v.max())


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_shape_dtype_and_statistics(case):
    op, args, kwargs, mean, std, support = case
    assert op in RANDOM_OPS
    expected = op(*args, **kwargs)
    out = run_lowering(op, *args, key=jax.random.key(1), **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype, (out.shape, out.dtype)
    _check_stats(out, mean, std, support)


def test_cauchy_median_and_quartiles():
    out = run_lowering(aten.cauchy.default, x, 1.0, 2.0).double()
    q = torch.quantile(out, T([0.25, 0.5, 0.75], dtype=f64))
    torch.testing.assert_close(q, T([-1.0, 1.0, 3.0], dtype=f64), atol=0.15, rtol=0)


def test_uniform_bounds_are_exclusive_above():
    out = run_lowering(aten.rand.default, [N])
    assert out.min() >= 0 and out.max() < 1


@pytest.mark.parametrize("dtype,high", [(torch.float32, 2**24), (torch.float64, 2**53), (torch.int64, 2**63 - 1)])
def test_random_default_range(dtype, high):
    out = run_lowering(aten.random.default, torch.empty(N, dtype=dtype))
    assert out.dtype == dtype and out.min() >= 0 and out.max() <= high
    assert out.double().mean() > high / 4  # spread over the range, not stuck near 0


def test_randperm_is_a_permutation():
    out = run_lowering(aten.randperm.default, 1000)
    assert out.dtype == i64 and torch.equal(out.sort().values, torch.arange(1000))
    assert not torch.equal(out, torch.arange(1000))


def test_multinomial_with_replacement_matches_probabilities():
    probs = T([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    out = run_lowering(aten.multinomial.default, probs, 5000, True)
    assert out.shape == (2, 5000) and out.dtype == i64
    freq = torch.stack([torch.bincount(row, minlength=4) for row in out]).double() / 5000
    torch.testing.assert_close(freq, (probs / probs.sum(1, keepdim=True)).double(), atol=0.03, rtol=0)


def test_multinomial_without_replacement_is_distinct_and_skips_zeros():
    probs = T([0.5, 0.0, 0.2, 0.3, 0.0])
    out = run_lowering(aten.multinomial.default, probs, 3)
    assert out.shape == (3,) and sorted(out.tolist()) == [0, 2, 3]


@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
def test_native_dropout_mask_fraction_and_scale(p):
    inp = torch.randn(N).abs() + 1
    out, mask = run_lowering(aten.native_dropout.default, inp, p, True)
    assert out.dtype == f32 and mask.dtype == torch.bool and mask.shape == inp.shape
    assert abs(mask.double().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(out, inp * mask / (1 - p))


def test_native_dropout_p1_gives_zeros():
    out, mask = run_lowering(aten.native_dropout.default, torch.randn(100), 1.0, True)
    assert (out == 0).all() and not mask.any()


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_native_dropout_eval_is_identity(dtype):
    inp = torch.randn(5, 7).to(dtype)
    out, mask = run_lowering(aten.native_dropout.default, inp, 0.5, False)
    assert torch.equal(out, inp) and mask.all() and mask.dtype == torch.bool


@pytest.mark.parametrize("op,args", [
    (aten.rand.default, ([64],)),
    (aten.randn_like.default, (torch.empty(8, 8),)),
    (aten.randint.low, (0, 2**40, [64])),
    (aten.bernoulli.p, (torch.empty(64), 0.5)),
    (aten.native_dropout.default, (torch.ones(64), 0.5, True)),
])
def test_same_key_same_values_other_key_other_values(op, args):
    def draw(seed):
        out = run_lowering(op, *args, key=jax.random.key(seed))
        return out[1] if isinstance(out, tuple) else out
    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))
