"""``torch.amp.GradScaler("spmd")``: its two kernels, written as ordinary tensor ops.

PyTorch implements them per device (CUDA, CPU); on this one they are recorded like any
other ops, so a scaled step stays one program. Semantics are CUDA's kernels':

- ``_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)``: every
  gradient multiplied by ``inv_scale`` in place, ``found_inf`` set to 1 if any held an
  inf or NaN (never reset here: GradScaler zeroes it);
- ``_amp_update_scale_(scale, growth_tracker, found_inf, growth, backoff, interval)``: the
  scale backs off after a non-finite step, else grows every ``interval`` steps without
  one (a grown scale that is not finite is left as it was).

``GradScaler.step`` reads ``found_inf`` on the host to decide whether to step, so with
``torchspmd.compile`` the scaler's ``step``/``update`` go outside the compiled function;
except with a fused optimizer (``fused=True``), which takes ``found_inf`` into its kernel
(``lowering/fused_optimizers.py``): then the whole scaled step compiles.

Example::

    scaler = torch.amp.GradScaler("spmd")
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
"""

from __future__ import annotations

import torch

from torchspmd.device.dispatch import register_handler

aten = torch.ops.aten


def unscale_checking_finite_(grads, found_inf, inv_scale) -> None:
    """``torch._amp_foreach_non_finite_check_and_unscale_`` (see the module docstring)."""
    if not grads:
        return
    bad = torch.stack([~torch.isfinite(g).all() for g in grads]).any()
    for g in grads:
        g.mul_(inv_scale.to(g.dtype))
    found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))


def update_scale_(scale, growth_tracker, found_inf, growth_factor: float,
                  backoff_factor: float, growth_interval: int):
    """``torch._amp_update_scale_`` (see the module docstring); returns ``scale``."""
    found = found_inf > 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = scale * growth_factor
    new_scale = torch.where(found, scale * backoff_factor,
                            torch.where(grow & torch.isfinite(grown), grown, scale))
    new_tracker = torch.where(found | grow, torch.zeros_like(successful), successful)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale


def install() -> None:
    """Register both kernels with the dispatcher (idempotent)."""
    register_handler(aten._amp_foreach_non_finite_check_and_unscale_.default,
                     unscale_checking_finite_)
    register_handler(aten._amp_update_scale_.default, update_scale_)
