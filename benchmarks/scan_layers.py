"""Compile time of a deep decoder's training step: ``scan_layers`` vs the unrolled loop.

Two copies of one decoder (token + position embedding, ``--layers`` pre-LayerNorm blocks
with causal SDPA attention and a GELU MLP, final LayerNorm, LM head; the blocks are
``torchspmd.testing.models.Block``) train from the same weights on the same batches with
SGD. One runs its blocks in a Python loop (XLA compiles ``--layers`` copies of the block,
forward and backward); the other through ``torchspmd.scan_layers`` (one ``lax.scan``
body each way). The persistent compilation cache is off, so every compile is real.

    python benchmarks/scan_layers.py [--layers 16] [--steps 10] [--batch 8] [--seq 64]
        [--dim 128] [--heads 4] [--vocab 256]

Prints each side's compile time (all XLA compiles during its steps, from torchspmd's
``compile_time_s`` counter: the first step, and the second, whose parameters are device
data) and those compiles' CPU seconds (``compile_cpu_s``, steadier under load), the
median time of the later steps (``--steps`` >= 3), their ratios (targets: compile >= 5x
faster, step time within 10%), and both loss curves, which must agree (relative 1e-4);
exits non-zero when they do not.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")  # one device: no replicated work
os.environ.pop("TORCHSPMD_COMPILATION_CACHE", None)  # measure real compiles

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.testing.models import Block  # noqa: E402

LOSS_RTOL = 1e-4


class Decoder(nn.Module):
    """Embeddings, ``layers`` blocks (looped or scanned), final norm, LM head."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int, scan: bool):
        super().__init__()
        self.scan = scan
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        if self.scan:
            x = torchspmd.scan_layers(self.blocks, x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.head(self.norm(x))


def train(model: Decoder, batches: list,
          lr: float = 0.05) -> tuple[list[float], float, list[float], int, float]:
    """Losses, seconds spent compiling, the wall time of each step, the compiles, and the
    CPU seconds spent compiling (all threads)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, times = [], []
    compile_before = torchspmd.metrics()["compile_time_s"]
    cpu_before = torchspmd.metrics()["compile_cpu_s"]
    graphs_before = torchspmd.metrics()["graphs_compiled"]
    for x, y in batches:
        start = time.perf_counter()
        logits = model(x.to("spmd"))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to("spmd").reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torchspmd.sync()  # the whole step (updates included) as one graph
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    metrics = torchspmd.metrics()
    return (losses, metrics["compile_time_s"] - compile_before, times,
            metrics["graphs_compiled"] - graphs_before, metrics["compile_cpu_s"] - cpu_before)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    unrolled = Decoder(args.vocab, args.dim, args.heads, args.layers, args.seq, scan=False)
    scanned = copy.deepcopy(unrolled)
    scanned.scan = True
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen),
                torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen))
               for _ in range(args.steps)]
    results = {}
    for name, model in (("unrolled", unrolled), ("scanned", scanned)):
        results[name] = train(model.to("spmd"), batches)

    print(f"decoder: {args.layers} layers, dim {args.dim}, heads {args.heads}, batch "
          f"{args.batch}, seq {args.seq}, vocab {args.vocab}; {args.steps} SGD steps")
    steady = {}
    for name, (_, compile_s, times, graphs, cpu_s) in results.items():
        steady[name] = statistics.median(times[2:]) if len(times) > 2 else float("nan")
        print(f"{name:9s} compile {compile_s:7.2f} s ({graphs} graphs, {cpu_s:.2f} CPU s)   "
              f"step (median after the first two) {steady[name] * 1e3:8.1f} ms")
    compile_ratio = results["unrolled"][1] / results["scanned"][1]
    print(f"compile time unrolled / scanned: {compile_ratio:.1f}x (target >= 5x)")
    # CPU seconds hardly change with the machine's load, wall seconds do (XLA compiles
    # kernels on several threads, which other processes slow down).
    cpu_ratio = results["unrolled"][4] / results["scanned"][4]
    print(f"compile CPU time unrolled / scanned: {cpu_ratio:.1f}x")
    print(f"step time scanned / unrolled: {steady['scanned'] / steady['unrolled']:.2f} "
          "(target <= 1.10)")
    ok = True
    for i, (a, b) in enumerate(zip(results["unrolled"][0], results["scanned"][0])):
        close = abs(a - b) <= LOSS_RTOL * abs(a)
        ok &= close
        print(f"step {i}: loss unrolled {a:.6f} scanned {b:.6f}{'' if close else '  DIFFERENT'}")
    print(f"loss check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
