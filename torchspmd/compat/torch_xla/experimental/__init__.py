"""``torch_xla.experimental``."""

from __future__ import annotations

import warnings

from torchspmd.compat import step_closures

from . import (gradient_accumulation, scan, scan_layers,  # noqa: F401
               spmd_fully_sharded_data_parallel, xla_sharding)


def eager_mode(enable: bool) -> None:
    """torchspmd has no op-by-op execution: with ``enable``, each ``optimizer.step()`` ends
    the step instead (its graph runs, then the step closures), with a warning saying so."""
    if enable and not step_closures.EAGER.enabled:
        warnings.warn("torchspmd.compat: torch_xla.experimental.eager_mode(True): torchspmd "
                      "records ops lazily; each optimizer.step() now runs the step's graph "
                      "(values are the same as eager ones). Reading a tensor runs it too.",
                      stacklevel=2)
    step_closures.set_eager(enable)


def is_eager_mode() -> bool:
    """Whether :func:`eager_mode` is on."""
    return step_closures.EAGER.enabled
