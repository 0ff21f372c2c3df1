"""Does activation checkpointing save memory? Compiled temporary memory, plain vs checkpointed.

A deep MLP (``--blocks`` residual blocks ``x + W2 gelu(W1 x)`` of width ``4 * dim``)
trains one SGD step on the spmd device, once plainly and once with every block under
``torch.utils.checkpoint.checkpoint``. Each step is one XLA program; XLA's memory
analysis of that program gives the bytes of temporaries it needs (activations kept for
the backward pass among them). Without a fence, XLA would merge the recomputation with
the forward (common subexpressions) and both numbers would be the same.

    python benchmarks/checkpoint_memory.py [--blocks 6] [--dim 32] [--batch 256]
        [--reentrant]

Prints both temporary sizes, their ratio and both losses. Exits non-zero when the
checkpointed step does not need less temporary memory or the losses differ.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")  # one device: per-device bytes are the total

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.runtime.execute import last_program  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


class DeepMLP(nn.Module):
    def __init__(self, blocks: int, dim: int, checkpointed: bool, reentrant: bool):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(blocks))
        self.checkpointed, self.reentrant = checkpointed, reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant) if self.checkpointed else block(x)
        return x


def step_temp_bytes(model: nn.Module, x: torch.Tensor) -> tuple[int, float]:
    """Temporary bytes of one training step's compiled program, and its loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    torchspmd.sync()
    return last_program().memory_analysis().temp_size_in_bytes, loss.item()


def measure(blocks: int, dim: int, batch: int, reentrant: bool = False) -> dict[str, float]:
    """Both steps' temporary bytes and losses (same initial weights, same batch)."""
    torch.manual_seed(0)
    x = torch.randn(batch, dim).to(torchspmd.device())
    if reentrant:
        x.requires_grad_()  # reentrant checkpoint needs an input that requires grad
    result = {}
    for name, checkpointed in (("plain", False), ("checkpointed", True)):
        torch.manual_seed(1)
        model = DeepMLP(blocks, dim, checkpointed, reentrant).to(torchspmd.device())
        result[f"{name}_temp_bytes"], result[f"{name}_loss"] = step_temp_bytes(model, x)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--reentrant", action="store_true", help="use_reentrant=True")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    r = measure(args.blocks, args.dim, args.batch, args.reentrant)
    mib = 1 << 20
    print(f"deep MLP: {args.blocks} blocks, dim {args.dim}, batch {args.batch}, "
          f"use_reentrant={args.reentrant}")
    print(f"temporary memory: plain {r['plain_temp_bytes'] / mib:.2f} MiB, checkpointed "
          f"{r['checkpointed_temp_bytes'] / mib:.2f} MiB "
          f"(ratio {r['checkpointed_temp_bytes'] / r['plain_temp_bytes']:.2f})")
    print(f"losses: plain {r['plain_loss']:.6f}, checkpointed {r['checkpointed_loss']:.6f}")
    saves = r["checkpointed_temp_bytes"] < r["plain_temp_bytes"]
    same = abs(r["plain_loss"] - r["checkpointed_loss"]) <= 1e-6 * max(1.0, abs(r["plain_loss"]))
    print(f"check: {'PASS' if saves and same else 'FAIL'}")
    return 0 if saves and same else 1


if __name__ == "__main__":
    sys.exit(main())
