"""Microseconds per recorded op in steady state, next to CPU eager PyTorch on the same ops.

The workload is a small MLP-ish step (matmul, add, relu, mul by a Python number, sum,
softmax, layer_norm, in-place add): what a model's forward records. Recording is timed
without running the graphs (sync happens outside the timed region), caches warm.

    python benchmarks/trace_overhead.py [--iters 200]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import torchspmd
from torchspmd.runtime.metrics import COUNTERS


def workload(x, w, b):
    h = x @ w
    h = h + b
    h = F.relu(h)
    h = h * 0.5
    h = F.layer_norm(h, h.shape[-1:])
    h = torch.softmax(h, dim=-1)
    h.add_(1.0)
    return h.sum()


def time_per_op(device: str, iters: int) -> tuple[float, int]:
    x, w, b = (torch.randn(*s, device=device) for s in ((8, 32), (32, 32), (32,)))
    workload(x, w, b)  # warm: shape cache, signatures, compile
    if device == "spmd":
        torchspmd.sync()
    ops_before = COUNTERS["ops_traced"]
    total = 0.0
    for _ in range(iters):
        start = time.perf_counter()
        workload(x, w, b)
        total += time.perf_counter() - start
        if device == "spmd":
            torchspmd.sync()  # not timed: keeps the pending graph from growing
    ops = (COUNTERS["ops_traced"] - ops_before) / iters if device == "spmd" else 0
    return total / iters, ops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    iters = parser.parse_args().iters
    # XLA's CPU threads and torch's intra-op threads contend on a small host; one torch
    # thread keeps the eager baseline honest (and is faster for ops this small).
    torch.set_num_threads(1)
    spmd_step, ops = time_per_op("spmd", iters)
    cpu_step, _ = time_per_op("cpu", iters)
    spmd_us, cpu_us = spmd_step / ops * 1e6, cpu_step / ops * 1e6
    print(f"recorded aten ops per step: {ops:.0f}")
    print(f"torchspmd trace: {spmd_us:6.1f} us/op   (target <= 15 us)")
    print(f"CPU eager:       {cpu_us:6.1f} us/op")
    print(f"ratio trace / eager: {spmd_us / cpu_us:.2f}")


if __name__ == "__main__":
    main()
