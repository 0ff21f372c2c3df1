"""Test-wide settings.

XLA's CPU client keeps threads busy after a run; torch's intra-op threads then fight them
for this machine's two cores and CPU reference runs slow down many times. One torch
thread keeps the CPU baselines fast.
"""

import torch

import torchspmd  # noqa: F401  (registers the device, configures JAX's 8 CPU devices)

torch.set_num_threads(1)
