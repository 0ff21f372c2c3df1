"""Test-wide settings.

Compiled programs go to a disk cache in the repo (``.cache/jax``, ignored by git), and
XLA compiles them at LLVM optimization level 0 (half the compile time; see below).

XLA's CPU client keeps threads busy after a run; torch's intra-op threads then fight them
for this machine's two cores and CPU reference runs slow down many times. One torch
thread keeps the CPU baselines fast.
"""

import os
from pathlib import Path

import torch

# Both test workers, and later runs, share compiled programs (set before JAX starts).
os.environ.setdefault("TORCHSPMD_COMPILATION_CACHE", str(Path(__file__).parent.parent / ".cache" / "jax"))
# On a fresh clone most of the suite's time is XLA compiling thousands of small programs,
# and most of that is LLVM optimizing the machine code. Level 0 halves a training step's
# compile; XLA's own (HLO) passes, the partitioner included, run as always, so the
# programs compute the same thing (only float rounding may differ, as between backends).
# Benchmarks and users keep XLA's default. An XLA_FLAGS that sets the level wins.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

import torchspmd  # noqa: E402,F401  (registers the device, configures JAX's 8 CPU devices)

torch.set_num_threads(1)
