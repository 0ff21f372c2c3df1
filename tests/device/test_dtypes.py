"""Every dtype keeps its dtype through ops and round trips bit-exactly."""

import pytest
import torch

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


def _sample(dtype):
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    if dtype.is_floating_point:
        return torch.tensor([1.1, -2.5, 3.0e3, 1e-3]).to(dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, 0, 1, info.max], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_bit_exact(dtype):
    x = _sample(dtype)
    back = x.to("spmd").cpu()
    assert back.dtype == dtype
    assert torch.equal(back, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ops_keep_the_dtype(dtype):
    x = _sample(dtype)
    y = x.to("spmd")
    expected = (x.clone() + x.clone()) if dtype != torch.bool else (x | x)
    actual = (y + y) if dtype != torch.bool else (y | y)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("a,b", [(torch.int32, torch.float32), (torch.uint8, torch.int8),
                                 (torch.bfloat16, torch.float16), (torch.int64, torch.float64),
                                 (torch.bool, torch.int16)])
def test_type_promotion_follows_pytorch(a, b):
    x, y = torch.ones(3, dtype=a), torch.ones(3, dtype=b)
    result = x.to("spmd") * y.to("spmd")
    assert result.dtype == (x * y).dtype
    assert torch.equal(result.cpu(), x * y)


def test_python_scalar_promotion():
    x = torch.arange(4)
    assert (x.to("spmd") * 0.5).dtype == torch.float32
    assert torch.equal((x.to("spmd") * 0.5).cpu(), x * 0.5)


def test_cast():
    x = torch.tensor([1.7, -2.2, 3.5])
    assert torch.equal(x.to("spmd").to(torch.int32).cpu(), x.to(torch.int32))
    assert torch.equal(x.to("spmd").to(torch.bfloat16).cpu(), x.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_floats_cast_to_uint8_through_int64_as_in_pytorch(dtype):
    # PyTorch defines float -> uint8 as float -> int64 -> uint8 on every device (c10's
    # TypeCast), so out-of-range values wrap; a direct cast would saturate.
    x = torch.tensor([-1.0, -10.0, 255.0, 256.0, 300.0, 700.0, 7.9, -0.5], dtype=dtype)
    assert torch.equal(x.to("spmd").to(torch.uint8).cpu(), x.to(torch.uint8))
    assert torch.equal(x.to("spmd").byte().cpu(), x.byte())
