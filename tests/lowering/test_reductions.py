"""Reduction and scan lowerings against CPU PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.lowering.helpers import check_lowering, samplers, to_jax
from tests.lowering.test_elementwise import EAGER, jitted_lowerings  # noqa: F401  (autouse fixture)

aten = torch.ops.aten
nan, inf = float("nan"), float("inf")
randn, randint, _ = samplers(1)


X = randn(2, 3, 4)
DIMS = [None, [], [1], [-1, 0]]


@pytest.mark.parametrize("op", [aten.sum.dim_IntList, aten.mean.dim, aten.nansum.default])
@pytest.mark.parametrize("dim", DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_dims(op, dim, keepdim):
    if op is aten.nansum.default and dim == []:
        pytest.skip("nansum(dim=[]): PyTorch's meta kernel reduces nothing, its CPU kernel everything")
    check_lowering(op, X, dim, keepdim, rtol=1e-4)


@pytest.mark.parametrize("op", [aten.sum.default, aten.prod.default, aten.mean.default])
def test_full_reductions(op):
    check_lowering(op, randn(2, 3) + 1, rtol=1e-4)
    check_lowering(op, torch.tensor(2.5))
    check_lowering(op, randn(2, 3).to(torch.bfloat16), atol=1e-2, rtol=1e-2)
    check_lowering(op, randn(2, 3), dtype=torch.float64)
    if op is not aten.mean.default:
        check_lowering(op, randint(2, 3, dtype=torch.int32))  # -> int64
        check_lowering(op, randn(2, 3) > 0)                   # bool -> int64


def test_sum_dtype_rules():
    check_lowering(aten.sum.dim_IntList, randint(2, 3, dtype=torch.int32), [1])
    check_lowering(aten.sum.dim_IntList, randint(2, 3, dtype=torch.uint8, lo=0), [0], True)
    check_lowering(aten.sum.dim_IntList, randint(2, 3), [1], dtype=torch.float32)
    check_lowering(aten.nansum.default, torch.tensor([[nan, 1.0], [2.0, nan]]), [0])
    check_lowering(aten.mean.dim, randn(2, 3).to(torch.bfloat16), [1], atol=1e-2, rtol=1e-2)
    check_lowering(aten.mean.dim, torch.tensor(3.0), [0])


@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_dim(keepdim):
    check_lowering(aten.prod.dim_int, randn(2, 3), 1, keepdim)
    check_lowering(aten.prod.dim_int, randint(2, 3, dtype=torch.int32), -1, keepdim)


WITH_NAN = torch.tensor([[1.0, nan, 3.0, nan], [2.0, 2.0, -1.0, -1.0], [0.0, 5.0, 5.0, 0.0]])


@pytest.mark.parametrize("op", [aten.amax.default, aten.amin.default])
@pytest.mark.parametrize("dim", [[], [1], [0, 1]], ids=str)
def test_amax_amin(op, dim):
    check_lowering(op, WITH_NAN, dim)
    check_lowering(op, WITH_NAN, dim, True)
    check_lowering(op, randint(3, 4), dim)


@pytest.mark.parametrize("op", [aten.max.dim, aten.min.dim])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim_ties_and_nan(op, dim, keepdim):
    check_lowering(op, WITH_NAN, dim, keepdim)  # first index of ties; NaN wins
    check_lowering(op, randint(3, 4, lo=0, hi=3), dim, keepdim)


@pytest.mark.parametrize("op", [aten.argmax.default, aten.argmin.default])
def test_argmax_argmin(op):
    check_lowering(op, WITH_NAN)
    check_lowering(op, WITH_NAN, 1)
    check_lowering(op, WITH_NAN, 0, True)
    check_lowering(op, WITH_NAN, None, True)
    check_lowering(op, randint(3, 4, lo=0, hi=2), 1)
    check_lowering(op, torch.tensor(2.0), 0)


def test_full_max_min_aminmax():
    for x in (WITH_NAN, randn(2, 3), randint(2, 3), torch.tensor(1.5)):
        check_lowering(aten.max.default, x)
        check_lowering(aten.min.default, x)
        check_lowering(aten.aminmax.default, x)
    check_lowering(aten.max.dim, torch.tensor(3.0), 0)
    check_lowering(aten.aminmax.default, WITH_NAN, dim=1)
    check_lowering(aten.aminmax.default, randn(2, 3), dim=0, keepdim=True)
    check_lowering(aten.aminmax.default, randn(2, 3), keepdim=True)


@pytest.mark.parametrize("op", [aten.var.correction, aten.std.correction, aten.var_mean.correction,
                                aten.std_mean.correction])
@pytest.mark.parametrize("dim,correction,keepdim", [
    (None, None, False), ([1], 0, False), ([0, 2], 1, True),
    ([0], 5, False),  # correction >= N: inf / nan as PyTorch
])
def test_var_std(op, dim, correction, keepdim):
    check_lowering(op, X, dim, correction=correction, keepdim=keepdim, rtol=1e-4)


def test_var_bf16():
    check_lowering(aten.var.correction, X.to(torch.bfloat16), [1], atol=1e-2, rtol=1e-2)


def test_logsumexp():
    check_lowering(aten.logsumexp.default, X, [1])
    check_lowering(aten.logsumexp.default, X, [0, 2], True)
    check_lowering(aten.logsumexp.default, torch.tensor([[-inf, -inf], [inf, 1.0], [nan, 1.0]]), [1])
    check_lowering(aten.logsumexp.default, randint(2, 3), [1])  # int -> float32


@pytest.mark.parametrize("ord", [2, 1, 0, 3, 0.5, inf, -inf], ids=str)
def test_vector_norms(ord):
    check_lowering(aten.linalg_vector_norm.default, X, ord, rtol=1e-4)
    check_lowering(aten.linalg_vector_norm.default, X, ord, [1], True, rtol=1e-4)
    check_lowering(aten.norm.ScalarOpt_dim, X, ord, [0, 2], rtol=1e-4)
    check_lowering(aten.norm.Scalar, X, ord, rtol=1e-4)


def test_norm_dtypes():
    check_lowering(aten.linalg_vector_norm.default, X, 2, None, False, dtype=torch.float64)
    check_lowering(aten.norm.ScalarOpt_dtype, X, 2, dtype=torch.float64)
    check_lowering(aten.norm.ScalarOpt_dim_dtype, X, None, [1], False, dtype=torch.float64)
    check_lowering(aten.linalg_vector_norm.default, X.to(torch.bfloat16), 2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("ord", [2.0, 1.0, 0.0, 3.0, inf, -inf], ids=str)
def test_vector_norm_traced_ord(ord):
    meta = jax.ShapeDtypeStruct((2,), jnp.float32)
    fn = jax.jit(lambda x, p: EAGER[aten.linalg_vector_norm.default](meta, x, p, [1, 2]))
    got = fn(to_jax(X), jnp.asarray(ord))
    expected = torch.linalg.vector_norm(X, ord, [1, 2])
    np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-5)


def test_count_nonzero():
    x = randint(2, 3, 4, lo=-1, hi=2)
    check_lowering(aten.count_nonzero.default, x)
    check_lowering(aten.count_nonzero.default, x, 1)
    check_lowering(aten.count_nonzero.dim_IntList, x.float(), [0, 2])
    check_lowering(aten.count_nonzero.dim_IntList, x, [])


@pytest.mark.parametrize("name", ["all", "any"])
def test_all_any(name):
    pkt = getattr(aten, name)
    x = randint(2, 3, lo=0, hi=2).bool()
    check_lowering(pkt.default, x)
    check_lowering(pkt.default, torch.tensor([1, 2], dtype=torch.uint8))  # uint8 stays uint8
    check_lowering(pkt.dim, x, 1)
    check_lowering(pkt.dim, x.float(), 0, True)
    check_lowering(pkt.dims, x, [0, 1])
    check_lowering(pkt.dims, x, None, True)
    check_lowering(pkt.dims, x, [])  # reduces nothing
    check_lowering(pkt.default, torch.tensor([nan, 0.0]))


@pytest.mark.parametrize("op", [aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default])
def test_scans(op):
    check_lowering(op, randn(3, 4), 0, rtol=1e-4)
    check_lowering(op, randn(3, 4), -1, rtol=1e-4)
    check_lowering(op, torch.tensor(2.0), 0)
    check_lowering(op, randn(3, 4, dtype=torch.bfloat16), 1, atol=1e-2, rtol=1e-2)
    if op is aten.logcumsumexp.default:
        check_lowering(op, torch.tensor([-inf, -inf, 0.0, inf, 1.0, nan, 2.0]), 0)
    else:
        check_lowering(op, randint(3, 4, dtype=torch.int32), 1)  # -> int64
        check_lowering(op, randn(3, 4) > 0, 1)                   # bool -> int64
        check_lowering(op, randn(3, 4), 1, dtype=torch.float64)


@pytest.mark.parametrize("op", [aten.cummax.default, aten.cummin.default])
def test_cummax_cummin(op):
    check_lowering(op, torch.tensor([1.0, 1.0, nan, 3.0, nan, -1.0]), 0)  # ties: last index; NaN sticks
    check_lowering(op, randint(3, 5, lo=0, hi=3), 1)
    check_lowering(op, randn(3, 4), 0)
    check_lowering(op, torch.tensor(2.0), 0)


def test_traced_correction_under_jit():
    meta = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    fn = jax.jit(lambda x, c: EAGER[aten.var.correction](meta, x, [1], correction=c))
    np.testing.assert_allclose(np.asarray(fn(to_jax(X), jnp.asarray(0))),
                               torch.var(X, 1, correction=0).numpy(), rtol=1e-5)


@pytest.mark.parametrize("ord", [2, 1, 0, inf, 3.5])
def test_vector_norm_of_complex_input_uses_the_modulus(ord):
    z = torch.complex(randn(3, 4), randn(3, 4))
    check_lowering(aten.linalg_vector_norm.default, z, ord, [1], rtol=1e-4)


def test_norm_with_traced_ord_over_an_empty_dim():
    """A traced ord computes every formula: max/min must not fail on an empty reduction."""
    x = torch.zeros(0, 5)
    meta = jax.ShapeDtypeStruct((1, 5), jnp.float32)
    fn = jax.jit(lambda x, p: EAGER[aten.linalg_vector_norm.default](meta, x, p, [0], True))
    out = fn(to_jax(x), jnp.asarray(2.0))
    np.testing.assert_array_equal(np.asarray(out), torch.linalg.vector_norm(x, 2.0, 0, True).numpy())
