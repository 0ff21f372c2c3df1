"""``xm.add_step_closure``: functions run after the next graph runs (``mark_step``, ``sync``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import torchspmd

# The registry of queued closures: (function, args), run in order at the next step boundary.
PENDING: list[tuple[Callable, Sequence]] = []


def add(closure: Callable, args: Sequence = ()) -> None:
    """Queue ``closure(*args)`` for the next step boundary. Example: ``add(print, ("done",))``."""
    PENDING.append((closure, tuple(args)))


def run() -> None:
    """Run and forget the queued closures, oldest first. Example: ``add(f); run()``."""
    queued = PENDING[:]
    PENDING.clear()
    for closure, args in queued:
        closure(*args)


@dataclass
class EagerMode:
    """``torch_xla.experimental.eager_mode``: on, a global optimizer hook ends each step."""
    enabled: bool = False
    hook: Any = None  # the optimizer step post-hook's handle while enabled
    compiling: int = 0  # torch_xla.compile'd calls running (they end their own step)


# The registry of eager-mode state (one per process, as PyTorch/XLA's).
EAGER = EagerMode()


def _end_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if not EAGER.compiling:
        torchspmd.sync()
        run()


def set_eager(enable: bool) -> None:
    """Turn the optimizer-step boundary on or off. Example: ``set_eager(True)``."""
    if enable and EAGER.hook is None:
        EAGER.hook = register_optimizer_step_post_hook(_end_step)
    elif not enable and EAGER.hook is not None:
        EAGER.hook.remove()
        EAGER.hook = None
    EAGER.enabled = enable
