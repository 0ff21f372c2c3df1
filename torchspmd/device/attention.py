"""``F.scaled_dot_product_attention`` on the spmd device: one fused op, not the math path.

PyTorch picks an SDPA backend per device type, and a PrivateUse1 device gets the math path,
which folds batch and heads into one dimension (``expand`` + ``view`` + ``bmm``). Under GSPMD
that reshape merges a data-sharded and a model-sharded dimension, and XLA's partitioner
answers with all-gathers: on the fsdp+tp GPT step of ``benchmarks/train_step.py`` 8 extra
all-gathers of 4-D attention tensors that JAX's own step does not have.

CPU tensors take the fused kernel ``_scaled_dot_product_flash_attention_for_cpu`` instead;
its forward and backward are lowered as 4-D einsums (``lowering/attention.py``), which keep
batch and heads apart, with that kernel's values for fully masked rows (padded batches). Here spmd tensors take it too, in the cases that kernel accepts (no
dropout, no grouped-query heads, 4-D inputs with one head size); every other call keeps
PyTorch's math path, so the values are PyTorch's either way.

Example::

    install()                                           # once, by torchspmd.device
    F.scaled_dot_product_attention(q, k, v, is_causal=True)   # one fused op per call
"""

from __future__ import annotations

import torch

__all__ = ["install"]

aten = torch.ops.aten
_LIBRARIES: list = []  # keeps the registration alive


def _fused_accepts(query, key, value, attn_mask, dropout_p, enable_gqa) -> bool:
    if dropout_p != 0.0 or enable_gqa:
        return False
    if not (query.dim() == key.dim() == value.dim() == 4):
        return False
    if not (query.dtype == key.dtype == value.dtype and query.dtype.is_floating_point):
        return False
    if not (query.shape[-1] == key.shape[-1] == value.shape[-1]):
        return False
    if query.shape[:2] != key.shape[:2] or key.shape[:3] != value.shape[:3]:
        return False
    # CPU takes the kernel for a float mask of any float dtype (a float32 mask on bf16
    # queries too), and PyTorch's math path for a mask that needs a gradient.
    if attn_mask is not None and (attn_mask.requires_grad or not (
            attn_mask.dtype == torch.bool or attn_mask.dtype.is_floating_point)):
        return False
    return True


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    if not _fused_accepts(query, key, value, attn_mask, dropout_p, enable_gqa):
        return aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
            enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As PyTorch does before choosing a kernel: True keeps a score, False drops it.
        attn_mask = torch.zeros((), dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]


def install() -> None:
    """Route spmd SDPA to the fused op (idempotent)."""
    if _LIBRARIES:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("scaled_dot_product_attention", _sdpa, "AutogradPrivateUse1")
    _LIBRARIES.append(library)
