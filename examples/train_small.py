"""Train a small transformer on the spmd device and print its losses next to CPU's.

    python examples/train_small.py [--steps 20]

The device run records each step lazily, compiles it once with XLA (through JAX) and
reuses the compiled program every later step; the losses match CPU PyTorch.
"""

import argparse

import torch

import torchspmd
from torchspmd.testing.models import TinyTransformer, batches, lm_loss, train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    steps = parser.parse_args().steps
    torch.set_num_threads(1)  # XLA's CPU threads and torch's would fight for the cores
    torch.manual_seed(0)
    model, data = TinyTransformer(), batches(vocab=64, seq=16, batch=8, steps=steps)
    cpu = train(model, data, steps, "cpu", loss_fn=lm_loss, lr=3e-3)
    spmd = train(model, data, steps, torchspmd.device(), loss_fn=lm_loss, lr=3e-3,
                 sync=torchspmd.sync)
    print(f"{'step':>4}  {'spmd loss':>10}  {'cpu loss':>10}")
    for step, (a, b) in enumerate(zip(spmd, cpu)):
        print(f"{step:>4}  {a:10.6f}  {b:10.6f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(spmd, cpu))
    m = torchspmd.metrics()
    print(f"largest relative difference: {worst:.2e}")
    print(f"graphs compiled: {m['graphs_compiled']}, executions: {m['executions']}, "
          f"cache hits: {m['cache_hits']}")


if __name__ == "__main__":
    main()
