"""``_foreach_*`` lowerings against CPU PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.lowering.helpers import check_lowering, to_jax
from tests.lowering.test_elementwise import EAGER, jitted_lowerings  # noqa: F401  (autouse fixture)

aten = torch.ops.aten
_g = torch.Generator().manual_seed(2)


def tensors(lo=0.5, hi=2.0, dtype=torch.float32):
    """A list of tensors of different shapes (one 0-d), values in [lo, hi)."""
    return [(torch.rand(s, generator=_g) * (hi - lo) + lo).to(dtype) for s in ((2, 3), (4,), ())]


UNARY = "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 log1p log2 neg " \
        "reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc clone".split()


def test_unary():
    xs = tensors(0.1, 0.9)
    for name in UNARY:
        if name == "clone" and not hasattr(aten, "_foreach_clone"):
            continue  # PyTorch 2.11 has no _foreach_clone
        check_lowering(getattr(aten, f"_foreach_{name}").default, xs, rtol=1e-4)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow"])
def test_binary_overloads(name):
    pkt = getattr(aten, f"_foreach_{name}")
    xs, ys = tensors(), tensors()
    check_lowering(pkt.List, xs, ys, rtol=1e-4)
    check_lowering(pkt.Scalar, xs, 1.25, rtol=1e-4)
    check_lowering(pkt.ScalarList, xs, [0.5, 2, 1.5], rtol=1e-4)
    if hasattr(pkt, "Tensor"):
        check_lowering(pkt.Tensor, xs, torch.tensor(0.75), rtol=1e-4)


def test_alpha_and_int_lists():
    xs, ys = tensors(), tensors()
    check_lowering(aten._foreach_add.List, xs, ys, alpha=-0.5)
    check_lowering(aten._foreach_sub.List, xs, ys, alpha=2)
    check_lowering(aten._foreach_add.Tensor, xs, torch.tensor(0.75), alpha=3)
    ints = [torch.arange(6).reshape(2, 3), torch.arange(3)]
    check_lowering(aten._foreach_add.Scalar, ints, 2)
    check_lowering(aten._foreach_mul.Scalar, ints, 0.5)  # int list * float -> float32
    check_lowering(aten._foreach_add.List, tensors(dtype=torch.bfloat16), tensors(dtype=torch.bfloat16),
                   alpha=0.1, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
def test_addcmul_addcdiv(name):
    pkt = getattr(aten, f"_foreach_{name}")
    xs, t1, t2 = tensors(), tensors(), tensors()
    check_lowering(pkt.Scalar, xs, t1, t2, rtol=1e-4)
    check_lowering(pkt.Scalar, xs, t1, t2, -0.3, rtol=1e-4)
    check_lowering(pkt.ScalarList, xs, t1, t2, [0.1, -2.0, 3], rtol=1e-4)
    # The .Tensor overload wants its scalars on CPU, so the helper's meta run cannot take it.
    scalars = torch.tensor([0.1, -2.0, 3.0])
    meta = tuple(jax.ShapeDtypeStruct(tuple(x.shape), jnp.float32) for x in xs)
    got = EAGER[pkt.Tensor](meta, *([to_jax(t) for t in ts] for ts in (xs, t1, t2)), to_jax(scalars))
    for g, e in zip(got, pkt.Tensor(xs, t1, t2, scalars)):
        np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-5)


def test_lerp_pow_scalar_and_tensor():
    xs, ys, ws = tensors(), tensors(), tensors(0, 1)
    check_lowering(aten._foreach_lerp.List, xs, ys, ws)
    check_lowering(aten._foreach_lerp.Scalar, xs, ys, 0.9)
    check_lowering(aten._foreach_lerp.ScalarList, xs, ys, [0.1, 0.6, 1.0])
    check_lowering(aten._foreach_pow.ScalarAndTensor, 2.0, xs, rtol=1e-4)


def test_zero_copy_max():
    xs = tensors()
    check_lowering(aten._foreach_zero.default, xs)
    check_lowering(aten._foreach_copy.default, xs, tensors(dtype=torch.float64))  # cast to self's dtype
    check_lowering(aten._foreach_copy.default, xs, [torch.rand(3), torch.rand(1), torch.tensor(5.0)])  # broadcast
    check_lowering(aten._foreach_max.default, tensors(-2, 2))


@pytest.mark.parametrize("ord", [2, 1, float("inf"), 3])
def test_norm_powsum(ord):
    xs = tensors(-2, 2)
    check_lowering(aten._foreach_norm.Scalar, xs, ord, rtol=1e-4)
    check_lowering(aten._foreach_powsum.Scalar, xs, ord, rtol=1e-4)


def test_norm_dtype_and_bf16():
    check_lowering(aten._foreach_norm.Scalar, tensors(-2, 2), 2, torch.float64)
    check_lowering(aten._foreach_norm.Scalar, tensors(-2, 2, torch.bfloat16), 2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("jit", [False, True])
def test_traced_scalar_lists(jit):
    """Scalar[] items and Scalar arguments may be 0-d traced arrays (e.g. per-param step sizes)."""
    xs, t1, t2 = tensors(), tensors(), tensors()
    scalars = [0.1, -2.0, 3.0]
    meta = tuple(jax.ShapeDtypeStruct(tuple(x.shape), jnp.float32) for x in xs)
    cases = [
        (aten._foreach_addcdiv.ScalarList, (xs, t1, t2), scalars, lambda s: (s,)),
        (aten._foreach_mul.ScalarList, (xs,), scalars, lambda s: (s,)),
        (aten._foreach_add.Scalar, (xs,), 0.5, lambda s: (s,)),
        (aten._foreach_lerp.Scalar, (xs, t1), 0.25, lambda s: (s,)),
    ]
    for op, tensor_args, scalar, wrap in cases:
        expected = op(*tensor_args, *wrap(scalar))
        traced = [jnp.asarray(s) for s in scalar] if isinstance(scalar, list) else jnp.asarray(scalar)
        fn = lambda targs, s, _op=op: EAGER[_op](meta, *targs, s)  # noqa: E731
        got = (jax.jit(fn) if jit else fn)([[to_jax(t) for t in ts] for ts in tensor_args], traced)
        for g, e in zip(got, expected):
            assert g.dtype == jnp.float32 and g.shape == tuple(e.shape)
            np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-5)
