"""``torch_xla.amp.syncfree``: ``Adam``, ``AdamW`` and ``SGD`` that skip a step whose
gradients hold an inf without reading that on the host.

They are ``torch.optim``'s optimizers with ``fused=True``: a fused optimizer takes
``GradScaler``'s ``found_inf`` into its kernel (``lowering/fused_optimizers.py``), so a
scaled step compiles whole into one program. ``step(found_inf=t)`` works as in
PyTorch/XLA: the update is skipped where ``t`` is 1. The constructors take PyTorch/XLA's
arguments, in its order (which is ``torch.optim``'s).

Example: ``opt = torch_xla.amp.syncfree.AdamW(model.parameters(), lr=1e-3)``.
"""

from __future__ import annotations

import torch


class _SyncFree:
    """``fused=True`` unless ``foreach=True`` was asked for; ``step(found_inf=...)``."""

    def __init__(self, params, *args, **kwargs):
        if not kwargs.get("foreach"):
            kwargs.setdefault("fused", True)
        super().__init__(params, *args, **kwargs)

    def step(self, closure=None, found_inf: torch.Tensor | None = None):
        """One update; skipped (on the device, no host read) where ``found_inf`` is 1."""
        if found_inf is None:
            return super().step(closure)
        self.found_inf = found_inf  # what GradScaler hands a fused optimizer
        try:
            return super().step(closure)
        finally:
            del self.found_inf


class Adam(_SyncFree, torch.optim.Adam):
    """``torch.optim.Adam(..., fused=True)``. Example: ``Adam(model.parameters(), lr=1e-3)``."""


class AdamW(_SyncFree, torch.optim.AdamW):
    """``torch.optim.AdamW(..., fused=True)``. Example: ``AdamW(model.parameters(), lr=1e-3)``."""


class SGD(_SyncFree, torch.optim.SGD):
    """``torch.optim.SGD(..., fused=True)``.

    Example: ``SGD(model.parameters(), lr=0.1, momentum=0.9)``.
    """
