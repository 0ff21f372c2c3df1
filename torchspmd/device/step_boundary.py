"""A training step ends at ``optimizer.step()``: what is pending is launched there.

The lazy device records until a ``sync()`` or a read. A PyTorch loop written for an eager
device calls neither, and each step's parameters are computed from the last step's, so
every iteration joined one graph: the first read compiled the whole loop as one program
(300 steps of a two-layer MLP, read at the end: one program of every step, 6 minutes in
XLA's compiler). PyTorch/XLA asks for ``xm.mark_step()`` in each iteration; here every
``optimizer.step()`` over spmd parameters launches the pending work as ``sync()`` does,
without waiting (the host records the next step while the devices compute). A loop that
also calls ``sync()`` after the step finds nothing or little left to run. Inside a step
``torchspmd.compile`` records, ``sync()`` does nothing: that step is one program.

Example::

    for x, y in batches:                  # no sync() anywhere
        opt.zero_grad(); loss_fn(model(x), y).backward()
        opt.step()                        # this step's program launches here
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from torchspmd.device.tensor import SpmdTensor
from torchspmd.runtime.execute import sync

_INSTALLED: list = []  # the hook's handle, once installed


def install() -> None:
    """Register the hook on every ``torch.optim.Optimizer`` (idempotent)."""
    if not _INSTALLED:
        _INSTALLED.append(register_optimizer_step_post_hook(_launch_after_step))


def _launch_after_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    if any(group["params"] and isinstance(group["params"][0], SpmdTensor)
           for group in optimizer.param_groups):
        sync()
