"""Elementwise lowerings against CPU PyTorch (values, shapes, dtypes)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.lowering.helpers import check_lowering, run_lowering, samplers, to_jax
from torchspmd.lowering.registry import LOWERINGS

aten = torch.ops.aten
nan, inf = float("nan"), float("inf")
randn, randint, uniform = samplers(0)




def _meta(shape, dtype):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


# ------------------------------------------------- lowerings under jax.jit, as at runtime

def jit_lowering(fn):
    """``fn`` run under ``jax.jit``: array arguments traced, everything else static.

    That is how the runtime calls lowerings, and one compile per call signature (instead
    of one per eagerly run primitive) keeps these tests fast.
    """
    compiled = {}

    def call(meta, *args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        is_array = tuple(isinstance(leaf, jax.Array) for leaf in leaves)
        static = tuple(None if a else leaf for a, leaf in zip(is_array, leaves))
        key = (meta, tree, is_array, static)
        if key not in compiled:
            def body(arrays):
                it = iter(arrays)
                a, kw = jax.tree_util.tree_unflatten(tree, [next(it) if a else s for a, s in zip(is_array, static)])
                return fn(meta, *a, **kw)
            compiled[key] = jax.jit(body)
        return compiled[key]([leaf for leaf, a in zip(leaves, is_array) if a])

    return call


EAGER = dict(LOWERINGS)  # the lowerings themselves, for the tests that call them eagerly
_JITTED = {op: jit_lowering(fn) for op, fn in EAGER.items()}


@pytest.fixture(autouse=True)
def jitted_lowerings(monkeypatch):
    for op, fn in _JITTED.items():
        monkeypatch.setitem(LOWERINGS, op, fn)


# ------------------------------------------------------------------------- unary

_DOMAIN = {"any": (-3, 3), "pos": (0.1, 4), "unit": (-0.95, 0.95), "ge1": (1.05, 4), "small": (-1.2, 1.2)}
UNARY_FLOAT = [
    (aten.exp.default, "any"), (aten.exp2.default, "any"), (aten.expm1.default, "any"),
    (aten.log.default, "pos"), (aten.log2.default, "pos"), (aten.log10.default, "pos"),
    (aten.log1p.default, "pos"), (aten.sqrt.default, "pos"), (aten.rsqrt.default, "pos"),
    (aten.reciprocal.default, "pos"), (aten.sin.default, "any"), (aten.cos.default, "any"),
    (aten.tan.default, "small"), (aten.asin.default, "unit"), (aten.acos.default, "unit"),
    (aten.atan.default, "any"), (aten.sinh.default, "any"), (aten.cosh.default, "any"),
    (aten.tanh.default, "any"), (aten.asinh.default, "any"), (aten.acosh.default, "ge1"),
    (aten.atanh.default, "unit"), (aten.erf.default, "any"), (aten.erfc.default, "any"),
    (aten.erfinv.default, "unit"), (aten.sigmoid.default, "any"), (aten.sinc.default, "any"),
    (aten.deg2rad.default, "any"), (aten.rad2deg.default, "any"), (aten.lgamma.default, "pos"),
    (aten.digamma.default, "pos"), (aten.i0.default, "any"), (aten.special_i0e.default, "any"),
    (aten.special_i1.default, "any"), (aten.special_i1e.default, "any"),
    (aten.special_ndtri.default, "pos"), (aten.special_log_ndtr.default, "any"),
    (aten.special_erfcx.default, "any"), (aten.special_entr.default, "any"), (aten.angle.default, "any"),
    (aten.neg.default, "any"), (aten.abs.default, "any"), (aten.sign.default, "any"),
    (aten.sgn.default, "any"), (aten.floor.default, "any"), (aten.ceil.default, "any"),
    (aten.round.default, "any"), (aten.trunc.default, "any"), (aten.frac.default, "any"),
    (aten.clone.default, "any"), (aten.lift_fresh_copy.default, "any"), (aten._conj_physical.default, "any"),
]


@pytest.mark.parametrize("op,domain", UNARY_FLOAT, ids=lambda v: str(v))
def test_unary_float32(op, domain):
    lo, hi = _DOMAIN[domain]
    x = uniform(lo, hi, 3, 4)
    if op is aten.special_ndtri.default:
        x = uniform(0.02, 0.98, 3, 4)
    check_lowering(op, x, atol=1e-5, rtol=1e-4)


# Ops PyTorch defines on integer tensors (the float ones promote to float32).
UNARY_INT = [aten.angle.default, aten.exp.default, aten.sqrt.default, aten.sin.default, aten.sigmoid.default,
             aten.reciprocal.default, aten.neg.default, aten.abs.default, aten.sign.default,
             aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
             aten.bitwise_not.default, aten.clone.default, aten.deg2rad.default]


@pytest.mark.parametrize("op", UNARY_INT, ids=str)
def test_unary_int(op):
    check_lowering(op, randint(2, 5, lo=1), rtol=1e-4)
    if op in (aten.exp.default, aten.neg.default, aten.bitwise_not.default):
        check_lowering(op, randint(2, 5, lo=1, dtype=torch.int32), rtol=1e-4)


@pytest.mark.parametrize("op", [aten.exp.default, aten.sin.default, aten.sigmoid.default, aten.log.default,
                                aten.round.default, aten.neg.default, aten.rsqrt.default])
def test_unary_bf16(op):
    check_lowering(op, uniform(0.1, 3, 4, 5).to(torch.bfloat16), atol=1e-2, rtol=1e-2)


def test_unary_nan_inf_and_0d():
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1.5])
    for op in (aten.exp.default, aten.sign.default, aten.floor.default, aten.sigmoid.default,
               aten.digamma.default, aten.special_entr.default, aten.abs.default):
        check_lowering(op, x)
    check_lowering(aten.sqrt.default, torch.tensor(4.0))


@pytest.mark.parametrize("op", [aten.isnan.default, aten.isinf.default, aten.isposinf.default,
                                aten.isneginf.default, aten.signbit.default, aten.logical_not.default])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_predicates(op, dtype):
    x = torch.tensor([nan, inf, -inf, 0.0, -0.0, -2.0, 3.0]) if dtype != torch.int64 else randint(7)
    check_lowering(op, x.to(dtype))


def test_conj_complex():
    z = torch.complex(randn(3), randn(3))
    check_lowering(aten._conj_physical.default, z)
    for op in (aten.abs.default, aten.angle.default, aten.sgn.default, aten.exp.default):
        check_lowering(op, z, rtol=1e-5)
    assert torch.equal(run_lowering(aten._conj.default, z), z.conj().resolve_conj())


def test_round_decimals_logit_nan_to_num_mvlgamma_polygamma_frexp():
    x = randn(3, 4) * 100
    check_lowering(aten.round.decimals, x, decimals=2)
    check_lowering(aten.round.decimals, x, decimals=-1)
    p = uniform(0.0, 1.0, 10)
    check_lowering(aten.logit.default, p, rtol=1e-4)
    check_lowering(aten.logit.default, torch.tensor([0.0, 0.5, 1.0]), 0.01)
    y = torch.tensor([nan, inf, -inf, 1.0])
    check_lowering(aten.nan_to_num.default, y)
    check_lowering(aten.nan_to_num.default, y, 1.0, 2.0, -2.0)
    check_lowering(aten.nan_to_num.default, y.to(torch.bfloat16))
    check_lowering(aten.mvlgamma.default, uniform(2, 5, 6), 3, rtol=1e-4)
    check_lowering(aten.polygamma.default, 1, uniform(0.5, 4, 6), rtol=1e-4)
    check_lowering(aten.polygamma.default, 0, uniform(0.5, 4, 6), rtol=1e-4)
    check_lowering(aten.frexp.Tensor, randn(5) * 1000)


# ------------------------------------------------------------------------ binary

BINARY_FLOAT = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.rsub.Tensor,
                aten.atan2.default, aten.hypot.default, aten.copysign.Tensor, aten.maximum.default,
                aten.minimum.default, aten.fmax.default, aten.fmin.default, aten.fmod.Tensor,
                aten.remainder.Tensor, aten.xlogy.Tensor, aten.special_xlog1py.default,
                aten.heaviside.default, aten.logaddexp.default, aten.logaddexp2.default,
                aten.floor_divide.default, aten.nextafter.default, aten.ldexp.Tensor,
                aten.pow.Tensor_Tensor]


@pytest.mark.parametrize("op", BINARY_FLOAT, ids=str)
def test_binary_float32_broadcast(op):
    a, b = randn(2, 3), randn(3)
    if op in (aten.xlogy.Tensor, aten.special_xlog1py.default, aten.pow.Tensor_Tensor):
        b = b.abs()
    if op is aten.ldexp.Tensor:
        b = randint(3)
    a[0, 0] = 0.0  # heaviside/xlogy at 0
    check_lowering(op, a, b, rtol=1e-4)


BINARY_INT = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.maximum.default,
              aten.minimum.default, aten.fmod.Tensor, aten.remainder.Tensor, aten.floor_divide.default,
              aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor,
              aten.atan2.default, aten.copysign.Tensor, aten.pow.Tensor_Tensor]


@pytest.mark.parametrize("op", BINARY_INT, ids=str)
def test_binary_int64(op):
    a = randint(4, 5, lo=-20, hi=21)
    b = randint(5, lo=1, hi=6) * torch.tensor([1, -1, 1, -1, 1])
    if op is aten.pow.Tensor_Tensor:
        b = b.abs()
    check_lowering(op, a, b)


def test_binary_special_functions():
    a, b = uniform(0.5, 4, 2, 3), uniform(0.5, 4, 3)
    for op in (aten.igamma.default, aten.igammac.default, aten.special_zeta.default):
        check_lowering(op, a + 1, b, rtol=1e-4)
    check_lowering(aten.special_zeta.other_scalar, a + 1, 2.0, rtol=1e-4)
    x, y = randint(2, 3, lo=-12, hi=13), randint(3, lo=-12, hi=13)
    check_lowering(aten.gcd.default, x, y)
    check_lowering(aten.lcm.default, x, y)


def test_binary_mixed_dtypes_and_0d():
    check_lowering(aten.add.Tensor, randint(2, 3, dtype=torch.int32), randn(3))  # -> float32
    check_lowering(aten.mul.Tensor, randn(2, 3), torch.tensor(2.5, dtype=torch.float64))  # 0-d: float32
    check_lowering(aten.add.Tensor, randint(2, 3), torch.tensor(2.5, dtype=torch.float64))  # -> float64
    check_lowering(aten.add.Tensor, randn(2, 3, dtype=torch.bfloat16), randn(3), alpha=0.5)
    check_lowering(aten.add.Tensor, torch.tensor(1.0), torch.tensor(2.0))
    check_lowering(aten.add.Tensor, torch.tensor([True, False]), torch.tensor([True, True]))
    check_lowering(aten.div.Tensor, randint(2, 3), randint(3, lo=1))  # int / int -> float32


@pytest.mark.parametrize("op,scalar", [
    (aten.add.Scalar, 2.5), (aten.add.Scalar, 3), (aten.sub.Scalar, 0.25), (aten.rsub.Scalar, 1.0),
    (aten.mul.Scalar, 0.1), (aten.div.Scalar, 3.0), (aten.fmod.Scalar, -1.5), (aten.remainder.Scalar, -1.5),
    (aten.copysign.Scalar, -1.0), (aten.xlogy.Scalar_Other, 2.0), (aten.special_xlog1py.other_scalar, 2.0),
    (aten.floor_divide.Scalar, 0.7), (aten.pow.Tensor_Scalar, 2), (aten.pow.Tensor_Scalar, 3),
    (aten.pow.Tensor_Scalar, 2.0), (aten.pow.Tensor_Scalar, -0.5), (aten.pow.Tensor_Scalar, 0),
])
def test_scalar_overloads_float32(op, scalar):
    x = randn(3, 4)
    if op is aten.pow.Tensor_Scalar:
        x = x.abs() + 0.1
    check_lowering(op, x, scalar, rtol=1e-4)


@pytest.mark.parametrize("op,scalar", [
    (aten.add.Scalar, 2.5), (aten.add.Scalar, 3), (aten.mul.Scalar, 2), (aten.div.Scalar, 2),
    (aten.remainder.Scalar, -3), (aten.fmod.Scalar, -3), (aten.floor_divide.Scalar, -3),
    (aten.pow.Tensor_Scalar, 3), (aten.bitwise_and.Scalar, 6), (aten.bitwise_or.Scalar, 6),
    (aten.bitwise_xor.Scalar, 6), (aten.bitwise_left_shift.Tensor_Scalar, 2),
    (aten.bitwise_right_shift.Tensor_Scalar, 1), (aten.__lshift__.Scalar, 3), (aten.__rshift__.Scalar, 1),
])
def test_scalar_overloads_int64(op, scalar):
    check_lowering(op, randint(3, 4, lo=-20, hi=21), scalar)


def test_integer_power_with_negative_exponents_follows_pytorch():
    # 1 ** -n = 1, (-1) ** -n = +-1, any other base ** -n = 0 (0 included), as on CPU.
    base = torch.tensor([-8, -2, -1, 0, 1, 2, 9])[:, None]
    exponent = torch.tensor([-3, -2, -1, 0, 1, 2, 3])
    check_lowering(aten.pow.Tensor_Tensor, base, exponent)
    check_lowering(aten.pow.Scalar, -1, exponent)


def test_scalar_first_overloads():
    e = randn(3, 4)
    check_lowering(aten.pow.Scalar, 2.0, e)
    check_lowering(aten.pow.Scalar, 2, randint(5, lo=0))
    check_lowering(aten.remainder.Scalar_Tensor, 5.0, randn(4))
    check_lowering(aten.xlogy.Scalar_Self, 3.0, uniform(0.1, 2, 4))
    check_lowering(aten.special_xlog1py.self_scalar, 3.0, uniform(0.1, 2, 4))
    check_lowering(aten.bitwise_and.Scalar_Tensor, 6, randint(4))
    check_lowering(aten.bitwise_left_shift.Scalar_Tensor, 1, randint(4, lo=0, hi=8))


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_div_rounding_mode(mode, dtype):
    a = torch.tensor([7, -7, 7, -7, 0, 6, -6]).to(dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 3, -4]).to(dtype)
    check_lowering(aten.div.Tensor_mode, a, b, rounding_mode=mode)
    check_lowering(aten.div.Scalar_mode, a, -2, rounding_mode=mode)
    if dtype.is_floating_point:
        check_lowering(aten.div.Tensor_mode, randn(20) * 10, randn(20), rounding_mode=mode, rtol=1e-4)


@pytest.mark.parametrize("op", [aten.maximum.default, aten.minimum.default, aten.fmax.default,
                                aten.fmin.default])
def test_min_max_nan(op):
    check_lowering(op, torch.tensor([nan, 1.0, nan, 2.0]), torch.tensor([0.0, nan, nan, 3.0]))


def test_shifts_out_of_range():
    a = torch.tensor([1, -5, 2, -1])
    b = torch.tensor([70, 1, -1, 63])
    for op in (aten.bitwise_left_shift.Tensor, aten.bitwise_right_shift.Tensor, aten.__lshift__.Tensor,
               aten.__rshift__.Tensor):
        check_lowering(op, a, b)
    check_lowering(aten.bitwise_right_shift.Tensor, torch.tensor([200], dtype=torch.uint8),
                   torch.tensor([2], dtype=torch.uint8))


# --------------------------------------------------------------- comparisons, logic

CMP = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("name", CMP)
def test_comparisons(name):
    t, s = getattr(aten, name).Tensor, getattr(aten, name).Scalar
    a = randint(3, 4).float()
    check_lowering(t, randint(3, 4), a[0])                           # int vs float, broadcast
    check_lowering(t, a, torch.tensor(1.0, dtype=torch.float64))     # 0-d tensor: compared in float32
    check_lowering(t, torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]))
    check_lowering(s, randint(3, 4), 2.5)                            # int tensor vs float scalar
    check_lowering(s, torch.tensor([0.1, 0.5]).to(torch.bfloat16), 0.1)  # compared in bfloat16


@pytest.mark.parametrize("op", [aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default])
def test_logical(op):
    check_lowering(op, randint(3, 4, lo=-1, hi=2), torch.tensor([0.0, nan, 2.0, 0.0]))
    check_lowering(op, torch.tensor([True, False]), torch.tensor([[True], [False]]))


def test_bitwise_bool():
    a, b = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    for op in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor):
        check_lowering(op, a, b)
    check_lowering(aten.bitwise_not.default, a)


# --------------------------------------------------------------- ternary & friends

def test_clamp():
    x = torch.tensor([nan, -3.0, -0.5, 0.0, 0.5, 3.0])
    check_lowering(aten.clamp.default, x, -1.0, 1.0)
    check_lowering(aten.clamp.default, x, None, 1.0)
    check_lowering(aten.clamp.default, x, 2.0, 1.0)           # min > max gives max
    check_lowering(aten.clamp.default, randint(6), 0.5)        # int tensor, float bound -> float32
    check_lowering(aten.clamp.default, randint(6), -1, 2)
    check_lowering(aten.clamp.Tensor, randn(2, 3), randn(3), None)
    check_lowering(aten.clamp.Tensor, randn(3), randn(2, 1) - 1, randn(2, 1) + 1)  # bounds broadcast
    check_lowering(aten.clamp_min.default, x, 0.0)
    check_lowering(aten.clamp_max.default, x, 0.0)
    check_lowering(aten.clamp_min.Tensor, randn(2, 3), randn(3))
    check_lowering(aten.clamp_max.Tensor, randn(2, 3), randn(3))


def test_lerp_addcmul_addcdiv():
    a, b = randn(2, 3), randn(3)
    check_lowering(aten.lerp.Scalar, a, b, 0.3)
    check_lowering(aten.lerp.Scalar, a, b, 0.9)
    check_lowering(aten.lerp.Tensor, a, b, uniform(-1, 2, 2, 3))
    check_lowering(aten.lerp.Scalar, a.to(torch.bfloat16), b.to(torch.bfloat16), 0.7, atol=1e-2, rtol=1e-2)
    check_lowering(aten.addcmul.default, a, b, randn(2, 1), value=0.5)
    check_lowering(aten.addcmul.default, randint(2, 3), randint(3), randint(3), value=2)
    check_lowering(aten.addcdiv.default, a, b, randn(2, 3).abs() + 0.5, value=-0.1)
    check_lowering(aten.addcdiv.default, a, b, randn(2, 3).abs() + 0.5)


def test_where_and_casts():
    c = randn(2, 3) > 0
    check_lowering(aten.where.self, c, randn(2, 3), randint(3))
    check_lowering(aten.where.self, c, randn(3, dtype=torch.bfloat16), torch.tensor(0.0, dtype=torch.float64))
    x = torch.tensor([nan, -2.7, -0.2, 0.0, 2.7, 300.0])
    check_lowering(aten._to_copy.default, x[1:], dtype=torch.int64)   # truncation toward zero
    check_lowering(aten._to_copy.default, x, dtype=torch.bool)        # nan -> True
    check_lowering(aten._to_copy.default, x, dtype=torch.bfloat16)
    check_lowering(aten._to_copy.default, x, dtype=torch.float64, layout=torch.strided)
    out = EAGER[aten._to_copy.default](_meta((6,), jnp.float64), to_jax(x), dtype=torch.float64,
                                       device="cpu", non_blocking=True)  # device kwargs ignored
    assert out.dtype == jnp.float64
    check_lowering(aten._to_copy.default, randint(4), dtype=torch.float32)
    check_lowering(aten._to_copy.default, randint(4, lo=0, hi=3), dtype=torch.bool)
    check_lowering(aten.clone.default, x, memory_format=torch.contiguous_format)


# ---------------------------------------------------- traced (0-d jax array) Scalars

def _jax_vs_torch(op, args, jax_args, *, jit=True, **kwargs):
    expected = op(*args, **kwargs)
    meta = _meta(tuple(expected.shape), {torch.float32: jnp.float32, torch.bool: jnp.bool_,
                                          torch.int64: jnp.int64}[expected.dtype])
    fn = EAGER[op]
    got = (jax.jit(lambda *a: fn(meta, *a, **kwargs)) if jit else lambda *a: fn(meta, *a, **kwargs))(*jax_args)
    assert got.dtype == meta.dtype and got.shape == meta.shape
    np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_traced_scalars(jit):
    x = randn(3, 4)
    jx = to_jax(x)
    two = jnp.asarray(2.0)  # float64, as a Python float graph input would be
    _jax_vs_torch(aten.add.Scalar, (x, 2.0), (jx, two), jit=jit)
    _jax_vs_torch(aten.mul.Scalar, (x, 2.0), (jx, two), jit=jit)
    _jax_vs_torch(aten.pow.Tensor_Scalar, (x.abs(), 2.0), (jnp.abs(jx), two), jit=jit)
    _jax_vs_torch(aten.eq.Scalar, (x.round(), 2.0), (jnp.round(jx), two), jit=jit)
    _jax_vs_torch(aten.clamp.default, (x, -0.5, 0.5), (jx, jnp.asarray(-0.5), jnp.asarray(0.5)), jit=jit)
    _jax_vs_torch(aten.lerp.Scalar, (x, x * 2, 0.3), (jx, jx * 2, jnp.asarray(0.3)), jit=jit)
    y = randint(3, 4)
    _jax_vs_torch(aten.add.Scalar, (y, 3), (to_jax(y), jnp.asarray(3)), jit=jit)
    _jax_vs_torch(aten.lt.Scalar, (y, 2.5), (to_jax(y), jnp.asarray(2.5)), jit=jit)  # int vs float
    # keyword Scalars (alpha, value) traced
    meta = _meta((3, 4), jnp.float32)
    for op, args, kw in [(aten.add.Tensor, (x, x), "alpha"), (aten.sub.Tensor, (x, x * 3), "alpha"),
                         (aten.addcmul.default, (x, x, x), "value"), (aten.addcdiv.default, (x, x, x + 5), "value")]:
        expected = op(*args, **{kw: 0.5})
        fn = EAGER[op]
        call = lambda *a, s: fn(meta, *a, **{kw: s})  # noqa: E731
        got = (jax.jit(call) if jit else call)(*map(to_jax, args), s=jnp.asarray(0.5))
        np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-6)


def test_run_lowering_roundtrip_dtype():
    out = run_lowering(aten.add.Scalar, randint(3, dtype=torch.int32), 1)
    assert out.dtype == torch.int32
