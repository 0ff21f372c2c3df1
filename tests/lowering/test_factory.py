"""Factory, fill and copy lowerings against CPU PyTorch."""

import warnings

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.lowering.helpers import check_lowering, run_lowering
from torchspmd.lowering.registry import LOWERINGS

aten = torch.ops.aten
T = torch.tensor
x34 = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
i34 = torch.arange(12).reshape(3, 4)
b34 = x34.bfloat16()
f64, i64, bf16, i32 = torch.float64, torch.int64, torch.bfloat16, torch.int32

CASES = {
    "zeros": (aten.zeros.default, [2, 3]),
    "zeros_int": (aten.zeros.default, [4], {"dtype": i64}),
    "ones_bf16": (aten.ones.default, [2, 0, 3], {"dtype": bf16}),
    "full": (aten.full.default, [2, 3], 1.5),
    "full_int_from_float": (aten.full.default, [3], -2.7, {"dtype": i64}),
    "full_bool": (aten.full.default, [2], True),
    "full_0d": (aten.full.default, [], 3),
    "full_big_int": (aten.full.default, [2], 2**40 + 1),
    "scalar_tensor": (aten.scalar_tensor.default, 2.5),
    "scalar_tensor_int": (aten.scalar_tensor.default, 7, {"dtype": i32}),
    "full_like": (aten.full_like.default, i34, 5),
    "full_like_dtype": (aten.full_like.default, x34, 2, {"dtype": f64}),
    "zeros_like": (aten.zeros_like.default, b34),
    "ones_like": (aten.ones_like.default, i34, {"dtype": torch.bool}),
    "new_zeros": (aten.new_zeros.default, i34, [5]),
    "new_ones": (aten.new_ones.default, x34, [2, 2], {"dtype": bf16}),
    "new_full": (aten.new_full.default, x34, [3], -1.25),
    "fill_scalar": (aten.fill.Scalar, i34, 9),
    "fill_tensor": (aten.fill.Tensor, x34, T(0.5, dtype=f64)),
    "zero": (aten.zero.default, b34),
    "copy_same": (aten.copy.default, x34, x34 * 2),
    "copy_bcast_cast": (aten.copy.default, x34, T([1, 2, 3, 4])),
    "copy_to_int": (aten.copy.default, i34, x34 * 10),
    "copy_0d": (aten.copy.default, T(1.0), T(3.0)),
    "arange": (aten.arange.default, 7),
    "arange_float": (aten.arange.default, 4.5),
    "arange_start": (aten.arange.start, -3, 4, {"dtype": f64}),
    "arange_step": (aten.arange.start_step, 1, 2.5, 0.1),
    "arange_neg_step": (aten.arange.start_step, 10, 0, -3),
    "arange_bf16": (aten.arange.start_step, 0, 5, 0.5, {"dtype": bf16}),
    "arange_empty": (aten.arange.start_step, 3, 3, 1),
    "linspace": (aten.linspace.default, -1.0, 2.0, 7),
    "linspace_one": (aten.linspace.default, 3.0, 9.0, 1),
    "linspace_zero": (aten.linspace.default, 3.0, 9.0, 0),
    "linspace_int": (aten.linspace.default, -3, 7, 4, {"dtype": i64}),
    "linspace_tensors": (aten.linspace.Tensor_Tensor, T(0.0), T(1.0), 5),
    "linspace_tensor_scalar": (aten.linspace.Tensor_Scalar, T(2.0), 0.0, 4),
    "linspace_scalar_tensor": (aten.linspace.Scalar_Tensor, 0.0, T(2.0), 3, {"dtype": f64}),
    "logspace": (aten.logspace.default, 0.0, 3.0, 4),
    "logspace_base": (aten.logspace.default, -1.0, 2.0, 5, 2.0, {"dtype": f64}),
    "logspace_int": (aten.logspace.default, 0.5, 3.7, 4, {"dtype": i64}),
    "logspace_tensors": (aten.logspace.Tensor_Tensor, T(0.0), T(1.0), 3),
    "eye": (aten.eye.default, 3),
    "eye_m_int": (aten.eye.m, 2, 4, {"dtype": i64}),
    "eye_bool": (aten.eye.default, 2, {"dtype": torch.bool}),
    "tril_indices": (aten.tril_indices.default, 4, 3, -1),
    "triu_indices": (aten.triu_indices.default, 3, 5, 1),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_torch(case):
    op, *args = case
    kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
    check_lowering(op, *args, **kwargs)


@pytest.mark.parametrize("op,args", [
    (aten.empty.memory_format, ([2, 3],)),
    (aten.empty_strided.default, ([2, 3], [1, 2])),
    (aten.empty_permuted.default, ([2, 3], [1, 0])),
    (aten.new_empty.default, (x34, [4])),
    (aten.empty_like.default, (i34,)),
    (aten.new_empty_strided.default, (x34, [2, 2], [2, 1])),
])
def test_empty_is_zeros(op, args):
    expected = op(*args)
    out = run_lowering(op, *args)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert (out == 0).all()


@pytest.mark.parametrize("op,args", [
    (aten.full.default, lambda v: ([2, 2], v)),
    (aten.fill.Scalar, lambda v: (jnp.zeros((2, 2)), v)),
    (aten.new_full.default, lambda v: (jnp.zeros(3), [2, 2], v)),
    (aten.arange.start_step, lambda v: (v, 9.0, v)),
])
def test_scalar_may_be_a_traced_array(op, args):
    meta = jax.ShapeDtypeStruct((2, 2) if op is not aten.arange.start_step else (4,), jnp.float32)
    out = jax.jit(lambda v: LOWERINGS[op](meta, *args(v)))(jnp.asarray(2.0))
    assert out.dtype == jnp.float32 and float(out.max()) == (2.0 if op is not aten.arange.start_step else 8.0)


@pytest.mark.parametrize("args", [(8,), (9, False), (7, True, 5.0), (1,), (0,), (12, False, 0.0)],
                         ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_kaiser_window_matches_cpu(args, dtype):
    # It reached PyTorch's CPU-only dispatch stub as an internal assertion before.
    expected = torch.kaiser_window(*args, dtype=dtype)
    got = torch.kaiser_window(*args, dtype=dtype, device="spmd").cpu()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("n", [1, 2, 7, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_fft_sample_frequencies_match_cpu(n, dtype):
    # PyTorch writes fftfreq's negative half into a slice in place: it raised a storage
    # error on the spmd device before it had a lowering.
    for f in (torch.fft.fftfreq, torch.fft.rfftfreq):
        expected = f(n, 0.1, dtype=dtype)
        assert torch.equal(f(n, 0.1, dtype=dtype, device="spmd").cpu(), expected)


def test_deprecated_range_includes_its_end_as_on_cpu():
    # One after the other: the length comes from the numbers, which must key the program
    # (a second range of another length reused the first one's shape before).
    for args in [(0, 1, 0.25), (1, 4), (-1, 1, 0.3), (5, -5, -0.7)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch.range is deprecated
            expected, got = torch.range(*args), torch.range(*args, device="spmd")
        assert got.shape == expected.shape, args
        assert torch.equal(got.cpu(), expected), args
