"""``torch_xla.amp``: autocast and the gradient scaler on the spmd device.

PyTorch/XLA's ``autocast(device)`` is ``torch.autocast`` on its device; here it is
``torch.autocast("spmd")`` (bfloat16 unless ``dtype`` says otherwise, as on TPU), and
``GradScaler`` is ``torch.amp.GradScaler("spmd")``. The ``syncfree`` optimizers are
``torch.optim``'s with ``fused=True``, which skip an inf step on the device (``syncfree``).

Example (after ``torchspmd.compat.install()``)::

    from torch_xla.amp import autocast, GradScaler
    with autocast(torch_xla.device()):
        loss = model(x).float().square().mean()
"""

from __future__ import annotations

from typing import Any

import torch

from . import syncfree  # noqa: F401


def autocast(device: Any = None, enabled: bool = True, dtype: torch.dtype | None = None,
             cache_enabled: bool = True) -> torch.autocast:
    """``torch.autocast("spmd", dtype)``; ``dtype`` defaults to bfloat16 (PyTorch/XLA's TPU
    default; its CUDA default, float16, is one argument away).

    Example: ``with autocast(xm.xla_device()): y = model(x)``.
    """
    return torch.autocast("spmd", dtype=dtype or torch.bfloat16, enabled=enabled,
                          cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("spmd")`` with PyTorch/XLA's arguments (``use_zero_grad``
    changes nothing here: unscaling never syncs the host).

    Example: ``scaler = GradScaler(); scaler.scale(loss).backward(); scaler.step(opt)``.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True, use_zero_grad: bool = False):
        super().__init__("spmd", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
