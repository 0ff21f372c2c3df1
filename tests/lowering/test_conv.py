"""Convolution and pooling lowerings against CPU PyTorch (float64 for backward ops)."""

import pytest
import torch

from tests.lowering.test_linalg import check_lowering  # under jax.jit

aten = torch.ops.aten
F64 = dict(atol=1e-10, rtol=1e-10)


def r(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


# (input shape, weight shape, bias, stride, padding, dilation, transposed, output_padding, groups)
CONVS = {
    "1d": ((2, 4, 9), (6, 4, 3), True, [1], [0], [1], False, [0], 1),
    "1d_stride_pad": ((2, 4, 9), (6, 4, 3), True, [2], [1], [1], False, [0], 1),
    "2d": ((2, 4, 7, 8), (6, 4, 3, 3), True, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "2d_stride_pad": ((2, 4, 7, 8), (6, 4, 3, 2), True, [2, 1], [1, 2], [1, 1], False, [0, 0], 1),
    "2d_dilation": ((2, 4, 9, 9), (6, 4, 3, 3), False, [1, 1], [2, 2], [2, 2], False, [0, 0], 1),
    "2d_groups": ((2, 4, 7, 7), (6, 2, 3, 3), True, [1, 1], [1, 1], [1, 1], False, [0, 0], 2),
    "2d_depthwise": ((2, 4, 7, 7), (4, 1, 3, 3), False, [1, 1], [1, 1], [1, 1], False, [0, 0], 4),
    "3d": ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), True, [1, 2, 1], [0, 1, 1], [1, 1, 1], False, [0, 0, 0], 1),
    "2d_transposed": ((2, 4, 5, 5), (4, 6, 3, 3), True, [2, 2], [1, 1], [1, 1], True, [1, 0], 1),
    "2d_transposed_groups_dil": ((2, 4, 5, 5), (4, 3, 3, 2), True, [2, 1], [0, 1], [2, 1], True, [1, 0], 2),
    "1d_transposed": ((2, 4, 6), (4, 3, 3), False, [3], [1], [1], True, [2], 1),
    # The shapes on which XLA:CPU aborts (tests/lowering/test_xla_conv_bugs.py): a stride-2
    # conv2d's input gradient, and the transposed convolution of the same shapes.
    "2d_stride_xla_cpu_abort": ((2, 1, 3, 6), (2, 1, 3, 2), False, [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
    "2d_transposed_xla_cpu_abort": ((2, 2, 2, 4), (2, 1, 3, 2), False, [2, 2], [1, 1], [1, 1], True, [0, 0], 1),
}


def _conv_args(name, dtype=torch.float64):
    x, w, bias, *rest = CONVS[name]
    wt = r(*w, dtype=dtype)
    b = r(wt.shape[1] * rest[-1] if rest[3] else wt.shape[0], dtype=dtype) if bias else None
    return (r(*x, dtype=dtype), wt, b, *rest)


@pytest.mark.parametrize("name", CONVS)
def test_convolution(name):
    check_lowering(aten.convolution.default, *_conv_args(name), **F64)


def test_convolution_float32_and_bfloat16():
    check_lowering(aten.convolution.default, *_conv_args("2d_groups", torch.float32), atol=1e-5, rtol=1e-5)
    check_lowering(aten.convolution.default, *_conv_args("2d_stride_pad", torch.bfloat16), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("name", ["1d_stride_pad", "2d_stride_pad", "2d_dilation", "2d_groups", "3d",
                                  "2d_transposed_groups_dil", "1d_transposed", "2d_stride_xla_cpu_abort",
                                  "2d_transposed_xla_cpu_abort"])
@pytest.mark.parametrize("mask", [[True, True, True], [False, True, False]])
def test_convolution_backward(name, mask):
    x, w, b, *rest = _conv_args(name)
    out = aten.convolution(x, w, b, *rest)
    bias_sizes = None if b is None else list(b.shape)
    mask = [mask[0], mask[1], mask[2] and b is not None]
    check_lowering(aten.convolution_backward.default, r(*out.shape), x, w, bias_sizes, *rest, mask, **F64)


# (input shape, kernel, stride, padding, dilation, ceil_mode)
MAX_POOLS = {
    "k2": ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    "default_stride": ((2, 3, 8, 8), [2], [], [0], [1], False),
    "pad_ceil": ((2, 3, 8, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
    "dilation_rect": ((2, 3, 9, 10), [2, 3], [1, 2], [1, 1], [2, 1], False),
    "unbatched": ((3, 7, 7), [3, 3], [2, 2], [1, 0], [1, 1], True),
}


def _pool_input(shape):
    x = r(*shape)
    x.view(-1)[::5] = 0.5  # ties: the first maximum in window order wins
    return x


@pytest.mark.parametrize("name", MAX_POOLS)
def test_max_pool2d_with_indices(name):
    shape, *args = MAX_POOLS[name]
    x = _pool_input(shape)
    check_lowering(aten.max_pool2d_with_indices.default, x, *args, atol=0, rtol=0)  # indices compared exactly
    out, idx = aten.max_pool2d_with_indices(x, *args)
    check_lowering(aten.max_pool2d_with_indices_backward.default, r(*out.shape), x, *args, idx, **F64)


@pytest.mark.parametrize("output_size", [[3, 2], [4, 4], [5, 3]])
def test_adaptive_max_pool2d(output_size):
    x = _pool_input((2, 3, 8, 7))
    check_lowering(aten.adaptive_max_pool2d.default, x, output_size, atol=0, rtol=0)
    out, idx = aten.adaptive_max_pool2d(x, output_size)
    check_lowering(aten.adaptive_max_pool2d_backward.default, r(*out.shape), x, idx, **F64)


# (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_POOLS = {
    "k2": ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, None),
    "default_stride": ((2, 3, 8, 8), [3], [], [0], False, True, None),
    "pad_include": ((2, 3, 8, 7), [3, 3], [2, 2], [1, 1], False, True, None),
    "pad_exclude_ceil": ((2, 3, 8, 7), [3, 3], [2, 2], [1, 1], True, False, None),
    "pad_include_ceil": ((2, 3, 9, 8), [3, 2], [2, 2], [1, 1], True, True, None),
    "divisor": ((2, 3, 8, 8), [3, 3], [2, 1], [1, 1], True, True, 5),
    "unbatched": ((3, 7, 7), [2, 2], [2, 2], [1, 1], True, False, None),
}


@pytest.mark.parametrize("name", AVG_POOLS)
def test_avg_pool2d(name):
    shape, *args = AVG_POOLS[name]
    x = r(*shape)
    check_lowering(aten.avg_pool2d.default, x, *args, **F64)
    out = aten.avg_pool2d(x, *args)
    check_lowering(aten.avg_pool2d_backward.default, r(*out.shape), x, *args, **F64)


@pytest.mark.parametrize("output_size", [[3, 2], [4, 4], [5, 3], [1, 1]])
def test_adaptive_avg_pool2d(output_size):
    x = r(2, 3, 8, 7)
    check_lowering(aten._adaptive_avg_pool2d.default, x, output_size, **F64)
    out = aten._adaptive_avg_pool2d(x, output_size)
    check_lowering(aten._adaptive_avg_pool2d_backward.default, r(*out.shape), x, **F64)


def test_pooling_float32():
    x = r(2, 3, 8, 8, dtype=torch.float32)
    check_lowering(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [1, 1], True, atol=0, rtol=0)
    check_lowering(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False, None)
