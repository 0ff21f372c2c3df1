"""Giving an optimizer its state before a checkpoint is loaded into it.

``torch.optim`` creates its state (AdamW's step and moments) at the first ``step()``,
and ``torch.distributed.checkpoint`` loads in place: a fresh optimizer has nothing to
load into. :func:`prime_optimizer` runs one step with zero gradients so the state
exists, laid out as the step lays it out; the loaded checkpoint then overwrites all of
it (parameters included: weight decay moves them in that step).
"""

from __future__ import annotations

import torch

import torchspmd.runtime.execute

__all__ = ["prime_optimizer"]


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Create ``optimizer``'s state with one zero-gradient step (PyTorch/XLA's helper).

    Example::

        >>> prime_optimizer(optimizer)
        >>> state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        >>> dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
        >>> model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optim"])
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torchspmd.runtime.execute.sync()  # the state now has the layout the step gives it
    return optimizer
