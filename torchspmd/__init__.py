"""torchspmd: GSPMD sharding for PyTorch, compiled and run by XLA through JAX.

``import torchspmd as xs`` offers PyTorch/XLA's SPMD API. Example::

    import torch, torchspmd
    x = torch.randn(8, 4, device=torchspmd.device())
    y = (x @ x.T).relu()
    torchspmd.sync()
"""

import torchspmd.jax_setup  # noqa: F401  (must configure JAX before anything uses it)
from torchspmd.device.backend import device, device_count, register
from torchspmd.runtime.execute import sync, wait_device_ops
from torchspmd.runtime.metrics import metrics, reset as reset_metrics
from torchspmd.runtime.rng import manual_seed

register()

__all__ = ["device", "device_count", "sync", "wait_device_ops", "metrics", "reset_metrics",
           "manual_seed"]
