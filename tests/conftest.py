"""Test-wide settings.

Compiled programs go to a disk cache in the repo (``.cache/jax``, ignored by git).

XLA's CPU client keeps threads busy after a run; torch's intra-op threads then fight them
for this machine's two cores and CPU reference runs slow down many times. One torch
thread keeps the CPU baselines fast.
"""

import os
from pathlib import Path

import torch

# Both test workers, and later runs, share compiled programs (set before JAX starts).
os.environ.setdefault("TORCHSPMD_COMPILATION_CACHE", str(Path(__file__).parent.parent / ".cache" / "jax"))

import torchspmd  # noqa: E402,F401  (registers the device, configures JAX's 8 CPU devices)

torch.set_num_threads(1)
