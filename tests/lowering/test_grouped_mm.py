"""``aten._grouped_mm`` (``F.grouped_mm``) on the device against CPU PyTorch: each layout,
forward and backward, empty groups, tokens routed in any order, and the errors.

PyTorch's CPU kernel leaves the rows past ``offs[-1]`` uninitialized, so those rows are
compared with zeros (what the lowering writes) rather than with CPU's output.
"""

import pytest
import torch
import torch.nn.functional as F

import torchspmd as xs
from tests.lowering.helpers import run_lowering, samplers

aten = torch.ops.aten
randn, randint, _ = samplers(24)
DEV = xs.device()
# Group ends with an empty first group, an empty middle group, and 2 unused rows at the end.
OFFS = torch.tensor([0, 3, 3, 14], dtype=torch.int32)
ROWS = 16  # CPU PyTorch wants strides of multiples of 16 bytes
# float32 on both sides differs only in summation order; bfloat16 rounds once, as on CPU.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


def _close(actual, expected, dtype):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **TOL[dtype])


def _reference_rows(a, b, offs):
    """Row-grouped matmul as a loop of matmuls: rows of group g times ``b[g]``."""
    out, start = torch.zeros(a.shape[0], b.shape[-1], dtype=a.dtype), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = (a[start:end].float() @ b[g].float()).to(a.dtype)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_grouped_by_offs_match_cpu(dtype):
    """2-d x 3-d with offs (the MoE forward): each group's rows use their expert's matrix."""
    a, b = randn(ROWS, 8, dtype=dtype), randn(4, 8, 16, dtype=dtype)
    out = run_lowering(aten._grouped_mm.default, a, b, OFFS)
    used = int(OFFS[-1])
    _close(out[:used], torch._grouped_mm(a, b, offs=OFFS)[:used], dtype)
    _close(out, _reference_rows(a, b, OFFS), dtype)  # rows past offs[-1] are zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_contracted_dim_grouped_by_offs_matches_cpu(dtype):
    """2-d x 2-d with offs (the weight gradient): one (K, N) product per group, zero when empty."""
    a, b = randn(8, ROWS, dtype=dtype), randn(ROWS, 16, dtype=dtype)
    out = run_lowering(aten._grouped_mm.default, a, b, OFFS)
    _close(out, torch._grouped_mm(a, b, offs=OFFS), dtype)
    assert not out[0].any() and not out[2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_columns_grouped_by_offs_match_cpu(dtype):
    """3-d x 2-d with offs: the columns of b in group g use a[g]."""
    a, b = randn(4, 8, 8, dtype=dtype), randn(ROWS, 8, dtype=dtype).t()
    out = run_lowering(aten._grouped_mm.default, a, b, OFFS)
    used = int(OFFS[-1])
    _close(out[:, :used], torch._grouped_mm(a, b, offs=OFFS)[:, :used], dtype)
    assert not out[:, used:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_3d_operands_match_cpu(dtype):
    """3-d x 3-d without offs is a batched matmul."""
    a, b = randn(4, 8, 8, dtype=dtype), randn(4, 8, 16, dtype=dtype)
    _close(run_lowering(aten._grouped_mm.default, a, b), torch._grouped_mm(a, b), dtype)


def _experts(x, w_up, w_down, top_k_index, top_k_weights):
    """HF's ``grouped_mm_experts_forward`` in a few lines: sort the (token, expert) pairs by
    expert, two grouped matmuls, weigh, restore the order and sum over the top-k."""
    k = top_k_index.shape[1]
    ids, perm = torch.sort(top_k_index.reshape(-1))
    offs = torch.cumsum(torch.bincount(ids, minlength=w_up.shape[0]), 0).to(torch.int32)
    h = F.grouped_mm(x[perm // k], w_up.transpose(-2, -1), offs=offs)
    h = F.silu(h) * h
    h = F.grouped_mm(h, w_down.transpose(-2, -1), offs=offs) * top_k_weights.reshape(-1)[perm, None]
    return torch.empty_like(h).index_copy(0, perm, h).view(x.shape[0], k, -1).sum(1)


def test_routed_experts_forward_and_backward_match_cpu():
    """Tokens routed to experts in any order (one expert unused): output and every gradient
    (input, both expert weights, routing weights) equal CPU's."""
    x, w_up, w_down = randn(10, 8), randn(4, 16, 8), randn(4, 8, 16)
    top_k_index = torch.tensor([[3, 0], [0, 3], [3, 1], [1, 0], [3, 0], [0, 1], [1, 3], [3, 0],
                                [0, 3], [1, 0]])  # expert 2 gets no token
    top_k_weights = torch.rand(10, 2, generator=torch.Generator().manual_seed(3))
    results = []
    for device in ("cpu", DEV):
        leaves = [t.detach().to(device).requires_grad_() for t in (x, w_up, w_down, top_k_weights)]
        out = _experts(leaves[0], leaves[1], leaves[2], top_k_index.to(device), leaves[3])
        out.backward(torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(device) / 50)
        results.append([out.detach().cpu()] + [t.grad.cpu() for t in leaves])
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-5)


def test_batched_3d_backward_matches_cpu():
    """The gradients of the 3-d x 3-d layout, which PyTorch computes with _grouped_mm again."""
    a, b = randn(4, 8, 8), randn(4, 8, 16)
    grads = []
    for device in ("cpu", DEV):
        ta, tb = a.detach().to(device).requires_grad_(), b.detach().to(device).requires_grad_()
        out = torch._grouped_mm(ta, tb)
        out.backward(torch.ones_like(out).cumsum(-1).contiguous())
        grads.append((out.detach().cpu(), ta.grad.cpu(), tb.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs,message", [
    (dict(bias=torch.zeros(4, 16)), "bias is not supported"),
    (dict(offs=OFFS.long()), "offs must be a 1-d int32 tensor"),
    (dict(offs=None), "offs is required"),
    (dict(out_dtype=torch.bfloat16), r"out_dtype must be the operands' dtype \(torch.float32\)"),
])
def test_unsupported_arguments_raise_a_clear_error(kwargs, message):
    """Arguments CPU PyTorch also rejects raise an error naming the op and the argument."""
    args = dict(offs=OFFS) | kwargs
    a, b = randn(ROWS, 8).to(DEV), randn(4, 8, 16).to(DEV)
    with pytest.raises(RuntimeError, match=f"torch._grouped_mm: {message}"):
        torch._grouped_mm(a, b, **{k: (v.to(DEV) if isinstance(v, torch.Tensor) else v)
                                for k, v in args.items()})


def test_float64_operands_raise_a_clear_error():
    a, b = randn(ROWS, 8, dtype=torch.float64).to(DEV), randn(4, 8, 16, dtype=torch.float64).to(DEV)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        torch._grouped_mm(a, b, offs=OFFS.to(DEV))


def test_transformers_grouped_mm_fallback_op_and_its_backward_match_cpu():
    """Hugging Face's MoE calls its own custom op ``transformers::grouped_mm_fallback``
    under ``torch.compiler.is_compiling()`` (a compiled step's capture) with float32
    weights: decomposed into ``_grouped_mm`` (``device/library_ops.py``)."""
    pytest.importorskip("transformers.integrations.moe")
    fallback = torch.ops.transformers.grouped_mm_fallback
    x, w = randn(ROWS, 8), randn(4, 8, 5)
    results = []
    for device in ("cpu", DEV):
        xd = x.detach().to(device).requires_grad_(True)
        wd = w.detach().to(device).requires_grad_(True)
        out = fallback(xd, wd, OFFS.to(device))
        (out * torch.arange(5.0).to(device)).sum().backward()
        results.append([t.detach().cpu() for t in (out, xd.grad, wd.grad)])
    for got, want in zip(results[1], results[0]):
        if got.shape[0] == ROWS:  # rows past offs[-1]: CPU leaves them unset, here zeros
            want = want.clone()
            want[int(OFFS[-1]):] = 0
        torch.testing.assert_close(got, want, **TOL[torch.float32])
