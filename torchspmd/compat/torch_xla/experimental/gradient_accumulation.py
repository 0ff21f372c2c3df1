"""``torch_xla.experimental.gradient_accumulation``: ``train_step`` over the leading dim of
its inputs, gradients summed into ``.grad``.

PyTorch/XLA builds an XLA ``While`` loop; torchspmd records the loop unrolled, with the
same values (each micro-batch's loss divided by the number of steps, their sum returned).
Inside ``torchspmd.compile`` the unrolled loop is one program, traced once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def gradient_accumulation(train_step: Callable[..., Any],
                          iterable_tensors: tuple[torch.Tensor, ...], model: torch.nn.Module,
                          *carried_tensors: torch.Tensor) -> Any:
    """Runs ``train_step(*(t[i] for t in iterable_tensors), *carried)`` for each ``i`` of the
    leading dim, backpropagating ``loss / steps`` each time; adds the summed gradients to
    each parameter's ``.grad`` (zeros for a parameter no step used, as PyTorch/XLA).

    ``train_step`` returns the loss, or ``(loss, *carried)`` when carried tensors are
    given. Returns the accumulated loss (in the loss's dtype, where PyTorch/XLA's loop
    keeps a float32 one), followed by the last carried tensors if any.

    Example::

        >>> loss = gradient_accumulation(lambda x, y: F.mse_loss(model(x), y), (xs, ys), model)
        >>> optimizer.step()
    """
    if not iterable_tensors:
        raise ValueError("gradient_accumulation: iterable_tensors cannot be empty")
    steps = iterable_tensors[0].size(0) if isinstance(iterable_tensors[0], torch.Tensor) else 0
    for i, t in enumerate(iterable_tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"gradient_accumulation: element {i} of iterable_tensors is not "
                             f"a tensor")
        if t.numel() == 0:
            raise ValueError(f"gradient_accumulation: element {i} of iterable_tensors is empty")
        if t.size(0) != steps:
            raise ValueError(f"gradient_accumulation: element {i} of iterable_tensors has "
                             f"{t.size(0)} steps in its first dimension, element 0 has {steps}")
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None  # each step's gradients, summed by autograd, then added to the kept
    total = None
    carried = list(carried_tensors)
    try:
        for i in range(steps):
            result = train_step(*(t[i] for t in iterable_tensors), *carried)
            if carried_tensors:
                loss, *carried = result
            else:
                loss = result
            loss = loss / steps
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
    except BaseException:
        for p, grad in zip(params, kept):
            p.grad = grad  # a failed loop leaves the gradients as they were
        raise
    for p, grad in zip(params, kept):
        summed = p.grad if p.grad is not None else torch.zeros_like(p)
        p.grad = summed if grad is None else grad.add_(summed)
    return (total, *carried) if carried_tensors else total
