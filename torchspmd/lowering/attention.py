"""The fused CPU attention kernel's ops, lowered as 4-D einsums with that kernel's values.

``F.scaled_dot_product_attention`` reaches ``_scaled_dot_product_flash_attention_for_cpu``
and its backward on the spmd device too (``device/attention.py``), as CPU tensors do; the
einsums keep batch and heads apart for the partitioner.

Rows whose every key is masked are where a plain softmax and the CPU kernel part ways, and
padded batches have such rows (left padding under a causal mask). The kernel computes an
online softmax and its backward from the saved log-sum-exp, which gives:

- a row of ``-inf`` scores (bool mask, or float ``-inf``): output 0, log-sum-exp 0, and no
  gradient to or from that row (``exp(-inf - 0) == 0``), where a softmax gives NaN;
- a row of ``finfo.min`` scores (HF's float masks): every score rounds to ``finfo.min``, so
  the forward averages ``v`` over the row's keys, but the log-sum-exp ``min + log(n)`` rounds
  to ``min`` too, and the backward's probabilities ``exp(s - lse)`` are 1, not ``1/n``.

Both are reproduced here, so spmd and CPU give the same values forward and backward. Example::

    out, lse = _scaled_dot_product_flash_attention_for_cpu(meta, q, k, v, attn_mask=mask)
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering._common import outputs_like_meta as _outs
from torchspmd.lowering.linalg import precision
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten


def _dot(equation, a, b, dtype):
    """``einsum(equation, a, b)`` as ``linalg.dot`` multiplies inputs of ``dtype``: both
    operands in ``dtype``, accumulated in ``opmath(dtype)``. For half types that rounds
    the probabilities too, as PyTorch's flash kernels do, and on a GPU runs on the
    tensor cores."""
    return jnp.einsum(equation, a.astype(dtype), b.astype(dtype), precision=precision(dtype),
                      preferred_element_type=opmath(dtype))


def _scale(q, scale):
    return (1 / math.sqrt(q.shape[-1])) if scale is None else scale


def _scores(q, k, attn_mask, is_causal, scale, dtype):
    """Scaled scores with the mask added (bool: False drops) and the causal triangle at -inf."""
    scores = _dot("...qd,...kd->...qk", q, k, dtype) * _scale(q, scale)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ \
            else scores + attn_mask.astype(scores.dtype)
    if is_causal:
        scores = jnp.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
    return scores


def _forward(q, k, v, attn_mask, is_causal, scale, dtype):
    """Output and log-sum-exp of inputs of ``dtype`` (given in its accumulation type)."""
    scores = _scores(q, k, attn_mask, is_causal, scale, dtype)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isneginf(row_max), 0, row_max)  # a fully masked row: exp(-inf) = 0
    p = jnp.exp(scores - row_max)
    total = jnp.sum(p, axis=-1, keepdims=True)
    empty = total == 0
    out = _dot("...qk,...kd->...qd", p, v, dtype) / jnp.where(empty, 1, total)
    lse = jnp.where(empty, 0, row_max + jnp.log(jnp.where(empty, 1, total)))
    return out, lse[..., 0]


@infers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _out_and_logsumexp(query, key, value, *args, **kwargs):
    """The output like ``query`` and the log-sum-exp over (batch, heads, queries) in
    ``query``'s accumulation type, as the CPU kernel returns them (PyTorch 2.11's meta
    kernel says float32 for a float64 query; 2.13's agrees with the kernel)."""
    lse = torch.empty(query.shape[:-1], dtype=torch.float64 if query.dtype == torch.float64
                      else torch.float32, device=query.device)
    return query.new_empty(query.shape[:-1] + value.shape[-1:]), lse


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _scaled_dot_product_flash_attention_for_cpu(meta, query, key, value, dropout_p=0.0, is_causal=False, *,
                                                attn_mask=None, scale=None):
    if float(dropout_p) != 0.0:  # spmd SDPA takes this kernel only without dropout
        raise NotImplementedError("torchspmd: _scaled_dot_product_flash_attention_for_cpu with "
                                  "dropout; call F.scaled_dot_product_attention instead")
    acc = opmath(meta[0].dtype)
    return _outs(meta, _forward(query.astype(acc), key.astype(acc), value.astype(acc), attn_mask, is_causal,
                                scale, meta[0].dtype))


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _scaled_dot_product_flash_attention_for_cpu_backward(meta, grad_out, query, key, value, out, logsumexp,
                                                         dropout_p, is_causal, *, attn_mask=None, scale=None):
    # The kernel's backward: probabilities from the saved log-sum-exp, not a fresh softmax.
    acc = opmath(meta[0].dtype)
    q, k, v, g, o = (t.astype(acc) for t in (query, key, value, grad_out, out))
    dtype = meta[0].dtype
    p = jnp.exp(_scores(q, k, attn_mask, is_causal, scale, dtype) - logsumexp.astype(acc)[..., None])
    dp = _dot("...qd,...kd->...qk", g, v, dtype)
    ds = p * (dp - jnp.sum(g * o, axis=-1, keepdims=True)) * _scale(q, scale)
    dq = _dot("...qk,...kd->...qd", ds, k, dtype)
    dk = _dot("...qk,...qd->...kd", ds, q, dtype)
    dv = _dot("...qk,...qd->...kd", p, g, dtype)
    return _outs(meta, (dq, dk, dv))
