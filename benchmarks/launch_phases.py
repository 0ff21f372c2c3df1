"""Where a compiled step's host time goes around its XLA call, in wall and CPU time.

The sweep's host column is the wall time until a call returns. On a CPU host it is
bimodal: the work after the XLA call returns is sometimes descheduled for a time slice,
because the program just launched wakes XLA:CPU's threads on every core. This splits
each call of a ``torchspmd.compile`` step into three phases (before the XLA call, the
call, after it) and prints the quartiles of their wall and thread-CPU times, next to
the same model's JAX step host time, steps interleaved as in ``sweep.py``:

    python benchmarks/launch_phases.py [--point mlp:128:2] [--steps 300]

Timings on a shared machine are noisy: quote the load with them.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")

import jax  # noqa: E402
import torch  # noqa: E402

from host_floor import model_args  # noqa: E402
from step_trainers import build_model, compiled_trainer, jax_trainer  # noqa: E402
from torchspmd.testing.models import batches  # noqa: E402

PHASES = ("before the call", "the XLA call", "after it", "whole launch")
QUANTILES = (0.25, 0.5, 0.75, 0.9)


def quartiles(values: list[float]) -> str:
    ordered = sorted(values)
    return " / ".join(f"{ordered[int(len(ordered) * q)] * 1e3:.2f}" for q in QUANTILES)


def time_compiled_calls(marks: dict) -> None:
    """Record the clocks around every call of a compiled JAX executable in ``marks``
    (the executable a ``torchspmd.compile`` replay runs; JAX's jitted step does not go
    through ``jax.stages.Compiled``)."""
    call = jax.stages.Compiled.__call__

    def timed(self, *args):
        marks["start"] = (time.perf_counter(), time.thread_time())
        try:
            return call(self, *args)
        finally:
            marks["end"] = (time.perf_counter(), time.thread_time())

    jax.stages.Compiled.__call__ = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--point", default="mlp:128:2", help="family:width:depth")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as sweep.py: XLA's threads and torch's share a small host
    family, width, depth = args.point.split(":")
    shape = model_args(family, int(width), int(depth))
    model = build_model(shape)
    total = args.warmup + args.steps
    data = batches(shape.vocab, shape.seq, 8, steps=total)
    ours, theirs = compiled_trainer(model, total), jax_trainer(model, total, shape.heads)
    for i in range(args.warmup):
        ours(i, *data[i])
        theirs(i, *data[i])
    marks: dict = {}
    time_compiled_calls(marks)
    rows = []
    for i in range(args.warmup, total):
        start = (time.perf_counter(), time.thread_time())
        loss = ours.launch(i, *data[i])
        end = (time.perf_counter(), time.thread_time())
        loss.item()
        theirs(i, *data[i])
        points = (start, marks["start"], marks["end"], end)
        rows.append([[b[k] - a[k] for k in (0, 1)] for a, b in zip(points, points[1:])]
                    + [[end[k] - start[k] for k in (0, 1)]])
    print(f"{args.point}, {args.steps} steps, load average {os.getloadavg()[0]:.1f}; "
          f"quartiles {'/'.join(str(q) for q in QUANTILES)} in ms")
    for k, phase in enumerate(PHASES):
        print(f"  {phase:16} wall {quartiles([r[k][0] for r in rows])}   "
              f"cpu {quartiles([r[k][1] for r in rows])}")
    jax_host = theirs.host[args.warmup:]
    print(f"  {'JAX host':16} wall {quartiles(jax_host)}   "
          f"cpu {quartiles(theirs.host_cpu[args.warmup:])}")


if __name__ == "__main__":
    main()
