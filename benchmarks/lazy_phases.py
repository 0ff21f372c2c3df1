"""Where one step of the lazy loop spends its host time: recorded ops and CPU ms per phase.

The lazy loop (``opt.zero_grad(); loss.backward(); opt.step(); torchspmd.sync()``) on the
sweep's model (``sweep.py`` families), phase by phase: the number of ops recorded (exact,
from ``torchspmd.metrics()``) and the CPU time of the main thread and of the process
(autograd runs the backward on its own device thread; after ``sync()`` XLA's threads run
the program). ``opt.step()`` launches the program (``device/step_boundary.py``): the
graph's collection and launch are in the optimizer phase, and ``sync()`` finds nothing
left. CPU time is steadier than wall time on a loaded machine, but still noisy.

    python benchmarks/lazy_phases.py [--family mlp] [--dim 64] [--depth 1] [--steps 30]

Example output (CPU, dim 64, 1 block, 1 device)::

    phase       ops  main-thread CPU ms  process CPU ms
    forward      24                1.13            1.20
    backward     48                0.25            1.37
    ...
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchspmd
from torchspmd.testing.models import TinyTransformer, batches, lm_loss

PHASES = ("forward", "backward", "optimizer", "sync")


def measure(family: str, dim: int, depth: int, steps: int, warmup: int = 5) -> list[dict]:
    """Per phase: ops recorded in one step and median CPU ms (main thread, process)."""
    torch.manual_seed(0)
    seq, batch, vocab = 32, 8, 256
    model = TinyTransformer(vocab=vocab, dim=dim, heads=max(2, dim // 64), layers=depth,
                            seq=seq, attention=family != "mlp").to(torchspmd.device())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    data = batches(vocab, seq, batch, steps=4)
    rows = []
    for i in range(warmup + steps):
        x, y = (t.to(torchspmd.device()) for t in data[i % len(data)])
        marks = []

        def mark():
            marks.append((time.thread_time(), time.process_time(),
                          torchspmd.metrics()["ops_traced"]))

        mark()
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        mark()
        loss.backward()
        mark()
        opt.step()
        mark()
        torchspmd.sync()
        mark()
        torchspmd.wait_device_ops()
        loss.item()
        if i >= warmup:
            rows.append(marks)
    return [{"phase": name, "ops": rows[-1][k + 1][2] - rows[-1][k][2],
             "thread_ms": statistics.median((r[k + 1][0] - r[k][0]) * 1e3 for r in rows),
             "process_ms": statistics.median((r[k + 1][1] - r[k][1]) * 1e3 for r in rows)}
            for k, name in enumerate(PHASES)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="mlp", choices=("mlp", "gpt"))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'phase':10}{'ops':>5}{'main-thread CPU ms':>20}{'process CPU ms':>16}")
    for row in measure(args.family, args.dim, args.depth, args.steps):
        print(f"{row['phase']:10}{row['ops']:5d}{row['thread_ms']:20.2f}{row['process_ms']:16.2f}")


if __name__ == "__main__":
    main()
