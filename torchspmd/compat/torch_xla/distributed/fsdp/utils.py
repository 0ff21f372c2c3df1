"""``torch_xla.distributed.fsdp.utils``: ``checkpoint_module``."""

from __future__ import annotations

from types import MethodType

import torch
import torch.utils.checkpoint


def checkpoint_module(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its ``forward`` recomputed in the backward pass (activation
    checkpointing), returned for chaining.

    PyTorch's non-reentrant checkpoint serves it, so a forward whose inputs do not
    require grad is checkpointed too (PyTorch/XLA's reentrant one runs it plainly);
    values and gradients are the same.

    Example::

        >>> model = FSDPv2(checkpoint_module(block), mesh)
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"checkpoint_module: expected an nn.Module, got {type(module).__name__}")
    # Kept on the module and reached through it, so that a deep copy checkpoints its own.
    module._xla_checkpointed_forward_original = module.forward
    module.forward = MethodType(_checkpointed_forward, module)
    return module


def _checkpointed_forward(module: torch.nn.Module, *args, **kwargs):
    return torch.utils.checkpoint.checkpoint(module._xla_checkpointed_forward_original, *args,
                                             use_reentrant=False, **kwargs)
