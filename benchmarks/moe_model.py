"""``TinyMoE``: a decoder whose feed-forward is a mixture of experts, written like Hugging
Face's (transformers 5) Mixtral, for ``benchmarks/moe.py``; ``jax_moe.py`` is its JAX twin.

Each block: pre-LayerNorm causal attention (``TinyTransformer``'s, same parameter names),
then a router (softmax, top-k, renormalized) and experts stacked in 3-d parameters
``gate_up_proj`` (experts, 2 * hidden, dim) and ``down_proj`` (experts, dim, hidden),
applied as HF's ``grouped_mm`` implementation does: sort the (token, expert) pairs by
expert, two grouped matmuls, weigh, restore the order, sum over the top-k. So
``torchspmd.parallel.shard_experts`` finds and shards the experts as it does HF's.

Example::

    model = TinyMoE(vocab=256, dim=64, heads=4, layers=2, seq=32, experts=8, top_k=2)
    logits = model(torch.randint(0, 256, (4, 32)))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Experts(nn.Module):
    """Experts' weights stacked as HF stores them; the forward of HF's ``grouped_mm``."""

    def __init__(self, experts: int, dim: int, hidden: int):
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * hidden, dim) * dim ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, dim, hidden) * hidden ** -0.5)

    def forward(self, x, top_k_index, top_k_weights):
        k = top_k_index.shape[1]
        expert_ids, perm = torch.sort(top_k_index.reshape(-1))
        # Tokens per expert without a data-dependent shape (bincount's depends on the ids).
        counts = (expert_ids[:, None] == torch.arange(self.num_experts, device=x.device)).sum(0)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = F.grouped_mm(x[perm // k], self.gate_up_proj.transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        h = F.grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offs)
        h = h * top_k_weights.reshape(-1)[perm, None]
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.shape[0], device=x.device)
        return h[inv_perm].view(x.shape[0], k, -1).sum(1)


class MoEFeedForward(nn.Module):
    """Mixtral's sparse MoE block: router logits -> softmax -> top-k -> renormalize."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = Experts(experts, dim, hidden)

    def forward(self, x):
        b, t, d = x.shape
        x = x.reshape(-1, d)
        probs = F.softmax(self.gate(x), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return self.experts(x, ids, weights).view(b, t, d)


class MoEBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.moe = MoEFeedForward(dim, hidden, experts, top_k)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.moe(self.norm2(x))


class TinyMoE(nn.Module):
    """Token + position embedding, ``layers`` MoE blocks, final LayerNorm and LM head."""

    def __init__(self, vocab=256, dim=64, heads=4, layers=2, seq=32, hidden=128, experts=8,
                 top_k=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(MoEBlock(dim, heads, hidden, experts, top_k)
                                    for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
