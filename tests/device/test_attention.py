"""F.scaled_dot_product_attention on the spmd device: PyTorch's values and gradients, with
batch and heads kept apart (one fused op), so sharded attention needs no all-gathers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd
import torchspmd.debug
from torchspmd.debug import collectives

DEVICE = torchspmd.device()


def _qkv(b=2, h=4, q=8, k=8, d=16, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_heads = kv_heads or h
    return (torch.randn(b, h, q, d, generator=g), torch.randn(b, kv_heads, k, d, generator=g),
            torch.randn(b, kv_heads, k, d, generator=g))


def _values_and_grads(device, tensors, **kwargs):
    leaves = [t.clone().to(device).requires_grad_() for t in tensors]
    mask = kwargs.pop("attn_mask", None)
    if mask is not None:
        kwargs["attn_mask"] = mask.to(device)
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    (out * torch.linspace(-1, 1, out.shape[-1]).to(device)).sum().backward()
    return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]


CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
    "float mask": {"attn_mask": torch.randn(8, 8)},
    "bool mask": {"attn_mask": torch.rand(2, 1, 8, 8) > 0.3},
}


@pytest.mark.parametrize("case", CASES)
def test_attention_and_its_gradients_equal_cpu(case):
    tensors = _qkv()
    got = _values_and_grads(DEVICE, tensors, **CASES[case])
    expected = _values_and_grads("cpu", tensors, **CASES[case])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_cross_attention_with_other_key_lengths_equals_cpu():
    for causal in (False, True):
        tensors = _qkv(q=6, k=10)
        got = _values_and_grads(DEVICE, tensors, is_causal=causal)
        expected = _values_and_grads("cpu", tensors, is_causal=causal)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_bfloat16_attention_is_close_to_cpu():
    tensors = [t.to(torch.bfloat16) for t in _qkv()]
    got = _values_and_grads(DEVICE, tensors, is_causal=True)
    expected = _values_and_grads("cpu", tensors, is_causal=True)
    for g, e in zip(got, expected):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)


def test_bfloat16_attention_multiplies_bfloat16_accumulating_in_float32():
    # As CUDA's flash attention does (on a GPU: the tensor cores), not float32 operands.
    q, k, v = (t.to(torch.bfloat16).to(DEVICE) for t in _qkv())
    text = torchspmd.debug.pending_hlo([F.scaled_dot_product_attention(q, k, v, is_causal=True)])
    types = {}  # instruction name -> its type, e.g. "bf16[2,4,8,16]{3,2,1,0}"
    for line in text.splitlines():
        if " = " in line:
            name, rest = line.strip().removeprefix("ROOT ").split(" = ", 1)
            types[name] = rest.split(" ", 1)[0]
    dots = [line for line in text.splitlines() if " dot(" in line]
    assert len(dots) == 2, text
    for line in dots:
        result, operands = line.split(" dot(")
        names = operands.split(")", 1)[0].split(", ")
        assert result.split(" = ")[1].startswith("f32["), line
        assert all(types[n].startswith("bf16[") for n in names), (line, [types[n] for n in names])


def test_grouped_query_heads_take_the_math_path_with_cpu_values():
    tensors = _qkv(h=4, kv_heads=2)
    got = _values_and_grads(DEVICE, tensors, enable_gqa=True, is_causal=True)
    expected = _values_and_grads("cpu", tensors, enable_gqa=True, is_causal=True)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_three_dim_inputs_take_the_math_path_with_cpu_values():
    tensors = [t[0] for t in _qkv()]
    got = _values_and_grads(DEVICE, tensors, is_causal=True)
    expected = _values_and_grads("cpu", tensors, is_causal=True)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_dropout_still_drops():
    q, k, v = (t.to(DEVICE) for t in _qkv())
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    full = F.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(out.cpu(), full.cpu())


def test_attention_sharded_over_batch_and_heads_gathers_nothing():
    mesh = torchspmd.Mesh(np.arange(8), (2, 4), ("data", "model"))
    leaves = []
    for t in _qkv(b=4, h=8):
        t = t.to(DEVICE).requires_grad_()
        torchspmd.mark_sharding(t, mesh, ("data", "model", None, None))
        leaves.append(t)
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.sum().backward()
    torchspmd.sync()
    assert collectives()["all-gather"] == 0
