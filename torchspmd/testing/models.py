"""Small models that exercise what real training uses: the MLP and a tiny transformer.

Example::

    model = TinyTransformer(vocab=64, dim=32, heads=4, layers=2, seq=16)
    losses = train(model, batches(64, 16, 8, steps=5), steps=5, device="spmd")
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, sizes=(16, 64, 64, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


class Block(nn.Module):
    """Pre-LayerNorm causal attention then GELU MLP; ``attention=False``: the MLP only."""

    def __init__(self, dim: int, heads: int, attention: bool = True):
        super().__init__()
        self.heads = heads
        if attention:
            self.norm1 = nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        if not hasattr(self, "qkv"):
            return x + self.down(F.gelu(self.up(self.norm2(x))))
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token + position embedding, causal attention (SDPA), pre-LayerNorm, GELU MLP
    (``attention=False``: MLP-only blocks)."""

    def __init__(self, vocab=64, dim=32, heads=4, layers=2, seq=16, attention=True):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attention) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(vocab: int, seq: int, batch: int, steps: int, seed: int = 0):
    """Deterministic (input, target) token batches: next-token prediction on random text."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (steps, batch, seq + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def mse_loss(model, x, y):
    return F.mse_loss(model(x), y)


def train(model: nn.Module, data, steps: int, device, loss_fn=lm_loss, lr=1e-2,
          sync=None, on_step=None) -> list[float]:
    """Train a copy of ``model`` on ``device`` with AdamW and a decaying learning rate.

    ``sync`` is called after each optimizer step (``torchspmd.sync`` on the spmd device);
    ``on_step(step)`` lets a caller look at counters. Returns the losses.
    """
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    losses = []
    for step in range(steps):
        for group in opt.param_groups:  # a Python-number schedule must not recompile
            group["lr"] = lr * (1 - step / (2 * steps))
        x, y = (t.to(device) for t in data[step % len(data)])
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        if sync is not None:
            sync()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step)
    return losses


def adamw_reference_losses(model: nn.Module, data, lr: float = 1e-2) -> list[float]:
    """MSE losses of a copy of ``model`` trained on CPU with plain AdamW over ``data``.

    The reference curve sharded runs are compared with. Example::

        cpu = adamw_reference_losses(MLP(), [(torch.randn(8, 16), torch.randn(8, 4))])
    """
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
