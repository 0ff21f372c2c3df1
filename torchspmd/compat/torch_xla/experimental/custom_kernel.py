"""``torch_xla.experimental.custom_kernel``: PyTorch/XLA's Pallas kernels, as the math they compute.

PyTorch/XLA runs these as TPU Pallas kernels. Here each is the computation it stands for,
which XLA compiles for whatever backend JAX runs on: ``flash_attention`` is
``F.scaled_dot_product_attention`` with the kernel's masking rules, ``gmm``/``tgmm`` are
``torch._grouped_mm``. Values and gradients are the kernels'; the serving kernels (paged
and ragged attention, int8 matmuls) raise, naming what to use instead.

Example::

    >>> o = flash_attention(q, k, v, causal=True, partition_spec=("fsdp", None, None, None))
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
import torch.nn.functional as F

from torchspmd.sharding import get_global_mesh, mark_sharding_with_gradients

# The Pallas kernel adds this to masked logits instead of -inf, so a query that may attend
# to no key (its segment has no key) averages every value instead of returning NaN.
DEFAULT_MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    q_segment_ids: torch.Tensor | None = None,
                    kv_segment_ids: torch.Tensor | None = None, sm_scale: float = 1.0, *,
                    ab: torch.Tensor | None = None, partition_spec: Any = None,
                    mesh: Any = None) -> torch.Tensor:
    """``softmax((q @ k^T + ab) * sm_scale + mask) @ v``, as PyTorch/XLA's flash attention.

    ``q`` is ``[batch, heads, q_len, head_dim]``, ``k``/``v`` ``[batch, heads, kv_len,
    head_dim]`` (more leading batch dimensions are allowed without segment ids).
    ``sm_scale`` defaults to 1 (the caller scales ``q``, as the kernel expects). ``causal``
    masks keys after the query's position counted from the start of both sequences;
    segment ids let a query see only keys of its own segment (a query that sees no key
    averages every value, as the kernel's finite mask value makes it; its gradient is
    PyTorch's SDPA's). ``partition_spec`` lays out
    ``q``, ``k``, ``v`` and the output (and their gradients) over ``mesh`` (default: the
    global mesh). Attention is computed over the whole sequence even when the spec shards
    it (the TPU kernel, run per shard, would attend within each shard only).

    Example::

        >>> o = flash_attention(q / q.shape[-1] ** 0.5, k, v, causal=True)
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("torchspmd.compat: flash_attention needs both q_segment_ids and "
                         "kv_segment_ids, or neither.")
    if q.dim() < 3 or k.shape[:-2] != q.shape[:-2] or v.shape[:-1] != k.shape[:-1] \
            or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"torchspmd.compat: flash_attention expects q [batch, heads, q_len, "
                         f"d] and k, v [batch, heads, kv_len, d] with the same batch and "
                         f"heads; got q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                         f"{tuple(v.shape)} (repeat k and v's heads for grouped-query "
                         f"attention, as the kernel requires).")
    if partition_spec is not None:
        mesh = _mesh(mesh)
        q, k, v = (mark_sharding_with_gradients(t, mesh, tuple(partition_spec))
                   for t in (q, k, v))
    mask = _additive_mask(q, k, causal, q_segment_ids, kv_segment_ids, ab, sm_scale)
    if mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)
    if partition_spec is not None:
        o = mark_sharding_with_gradients(o, mesh, tuple(partition_spec))
    return o


def _mesh(mesh: Any):
    mesh = mesh if mesh is not None else get_global_mesh()
    if mesh is None:
        raise ValueError("torchspmd.compat: flash_attention(partition_spec=...) needs a mesh: "
                         "pass mesh= or call xs.set_global_mesh(mesh) first.")
    return mesh


def _additive_mask(q, k, causal, q_segment_ids, kv_segment_ids, ab, sm_scale):
    """The float mask SDPA adds after scaling (``ab`` scaled with the logits), or None when
    SDPA's own ``is_causal`` says it all."""
    if q_segment_ids is None and ab is None:
        return None
    q_len, kv_len = q.shape[-2], k.shape[-2]
    allowed = None
    if q_segment_ids is not None:
        if q.dim() != 4 or q_segment_ids.shape != (q.shape[0], q_len) \
                or kv_segment_ids.shape != (k.shape[0], kv_len):
            raise ValueError(f"torchspmd.compat: flash_attention's segment ids are [batch, "
                             f"q_len] and [batch, kv_len] for a 4-d q; got "
                             f"{tuple(q_segment_ids.shape)} and {tuple(kv_segment_ids.shape)} "
                             f"for q {tuple(q.shape)}.")
        allowed = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]
    if causal:
        below = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
        allowed = below if allowed is None else allowed & below
    # The mask value in q's dtype: float16 cannot hold float32's.
    mask_value = -0.7 * torch.finfo(q.dtype).max if q.dtype != torch.float32 \
        else DEFAULT_MASK_VALUE
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    mask = None if allowed is None else torch.where(allowed, zero, mask_value)
    if ab is not None:
        bias = ab.to(q.dtype) * sm_scale
        mask = bias if mask is None else bias + mask
    return mask


def gmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
        tiling: tuple[int, int, int] | None = None, group_offset: torch.Tensor | None = None,
        transpose_rhs: bool = False) -> torch.Tensor:
    """``lhs[rows of group i] @ rhs[i]`` for each group, rows grouped in order (megablox gmm).

    ``lhs`` is ``[m, k]``, ``rhs`` ``[groups, k, n]`` (``[groups, n, k]`` with
    ``transpose_rhs``), ``group_sizes`` ``[groups]``; rows past ``sum(group_sizes)`` are 0.
    ``tiling`` is a TPU tile size and is ignored. Differentiable.

    Example::

        >>> out = gmm(tokens_by_expert, expert_weights, tokens_per_expert)
    """
    if group_offset is not None:
        raise NotImplementedError("torchspmd.compat: gmm(group_offset=...) (a slice of the "
                                  "groups for a sharded rhs) is not supported: shard rhs with "
                                  "mark_sharding and pass every group.")
    if transpose_rhs:
        rhs = rhs.transpose(-1, -2)
    return torch._grouped_mm(lhs, rhs, offs=_offsets(group_sizes))


def tgmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
         tiling: tuple[int, int, int] = (512, 512, 512), group_offset: torch.Tensor | None = None,
         num_actual_groups: int | None = None) -> torch.Tensor:
    """``lhs[:, cols of group i] @ rhs[rows of group i]`` for each group: ``[groups, k, n]``
    from ``lhs`` ``[k, m]`` and ``rhs`` ``[m, n]`` (megablox tgmm, gmm's weight gradient).

    Example::

        >>> grad_rhs = tgmm(lhs.t(), grad, group_sizes)
    """
    if group_offset is not None or num_actual_groups is not None:
        raise NotImplementedError("torchspmd.compat: tgmm(group_offset=, num_actual_groups=) "
                                  "is not supported: pass every group.")
    return torch._grouped_mm(lhs, rhs, offs=_offsets(group_sizes))


def _offsets(group_sizes: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(group_sizes, 0, dtype=torch.int32)


class GMM:
    """``GMM.apply(lhs, rhs, group_sizes, tiling)``: :func:`gmm`, whose gradients flow already."""

    @staticmethod
    def apply(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
              tiling: tuple[int, int, int] | None = None) -> torch.Tensor:
        return gmm(lhs, rhs, group_sizes, tiling)


def gmm_backward(grad: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor,
                 group_sizes: torch.Tensor, tiling=(512, 512, 512)):
    """Gradients of :func:`gmm` with respect to ``lhs`` and ``rhs``."""
    return gmm(grad, rhs.transpose(-1, -2), group_sizes), tgmm(lhs.t(), grad, group_sizes)


_INSTEAD = {
    "paged_attention": "F.scaled_dot_product_attention over the gathered pages, or "
                       "torchspmd.generation's static KV cache",
    "multi_queries_paged_attention": "F.scaled_dot_product_attention over the gathered pages",
    "ragged_paged_attention": "F.scaled_dot_product_attention over the gathered pages",
    "quantized_matmul_int8": "a matmul on dequantized weights",
}


def __getattr__(name: str) -> NoReturn:
    if name.startswith("__"):
        raise AttributeError(name)
    instead = _INSTEAD.get(name, "torchspmd.call_jax runs a JAX function (Pallas kernels "
                                 "included where the backend has them) inside the step")
    raise NotImplementedError(f"torchspmd.compat: torch_xla.experimental.custom_kernel.{name} "
                              f"is a TPU kernel that is not served here; use {instead}.")


__all__ = ["flash_attention", "gmm", "tgmm", "GMM", "gmm_backward", "DEFAULT_MASK_VALUE"]
