"""Attention through ``jax.nn.dot_product_attention`` inside a PyTorch GPT block.

``call_jax`` puts the JAX function into the step's graph: it is compiled with the rest of
the step, its gradient comes from ``jax.vjp``, and on a GPU ``implementation="cudnn"``
selects JAX's cuDNN flash attention. Run::

    python examples/call_jax_attention.py            # checks against CPU PyTorch SDPA

Example::

    block = JaxAttentionBlock(dim=64, heads=4)        # a gpt.Block whose attention is JAX's
    y = block(torch.randn(2, 16, 64).to("spmd"))
"""

from __future__ import annotations

import copy
import os
import sys

import jax
import numpy as np
import torch

import torchspmd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import Attention, Block  # noqa: E402  (the example model, next to this file)


class JaxAttention(Attention):
    """``gpt.Attention`` with ``F.scaled_dot_product_attention`` replaced by JAX's.

    JAX takes ``(batch, seq, heads, head_dim)``; PyTorch's SDPA ``(batch, heads, seq,
    head_dim)``. ``implementation`` is passed to JAX (``None``: XLA's; ``"cudnn"`` on GPU).
    """

    implementation: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).view(b, t, self.heads, 3 * hd).split(hd, dim=-1)
        y = torchspmd.call_jax(jax.nn.dot_product_attention, q, k, v, is_causal=True,
                               implementation=self.implementation)
        return self.proj(y.reshape(b, t, d))


class JaxAttentionBlock(Block):
    """``gpt.Block`` whose attention runs as a JAX function (same parameters, same names)."""

    def __init__(self, dim: int, heads: int):
        super().__init__(dim, heads)
        self.attn = JaxAttention(dim, heads)


def compare(dim: int = 64, heads: int = 4, batch: int = 4, seq: int = 16) -> dict[str, float]:
    """Max |difference| between the JAX-attention block on spmd and the SDPA block on CPU,
    for the output and every parameter's gradient."""
    torch.manual_seed(0)
    cpu = Block(dim, heads)
    spmd = JaxAttentionBlock(dim, heads)
    spmd.load_state_dict(copy.deepcopy(cpu.state_dict()))
    spmd.to("spmd")
    mesh = torchspmd.Mesh(np.arange(8), (8,), ("data",))
    x = torch.randn(batch, seq, dim)
    xs = x.to("spmd")
    torchspmd.mark_sharding(xs, mesh, ("data", None, None))
    out_cpu, out_spmd = cpu(x), spmd(xs)
    out_cpu.square().mean().backward()
    out_spmd.square().mean().backward()
    diffs = {"output": (out_spmd.cpu() - out_cpu).abs().max().item()}
    for (name, p), q in zip(cpu.named_parameters(), spmd.parameters()):
        diffs[name] = (q.grad.cpu() - p.grad).abs().max().item()
    return diffs


if __name__ == "__main__":
    diffs = compare()
    for name, diff in diffs.items():
        print(f"{name:20s} max |spmd - cpu| = {diff:.2e}")
