"""Values of a step that failed: each raises, when used, an error naming what failed.

A program that cannot be compiled or launched (out of memory, a device error, a lowering
that fails while XLA compiles) must not take the rest of the session with it. Its roots
become leaves holding :class:`FailedValue` stand-ins, so they are no longer pending: later
syncs and reads of other tensors never run that work again, and reading one of these
tensors raises an error that names the failure (never a stale value)::

    big = torch.ones(2**33, device="spmd"); small = torch.ones(4, device="spmd") * 2
    torchspmd.sync()    # torch.OutOfMemoryError (for big's computation)
    small.cpu()         # tensor([2., 2., 2., 2.]): an independent computation, it ran
    big.cpu()           # torch.OutOfMemoryError again, naming the step
"""

from __future__ import annotations

import copy

import torch

from torchspmd.lazy.node import Node

__all__ = ["FailedValue", "StepFailedError", "mark_failed", "is_failed"]


class StepFailedError(RuntimeError):
    """A tensor's value was to be computed by a step that failed (the cause is chained)."""


class FailedValue:
    """Stands in for an array a failed step was to compute: any use raises its error."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = _detached(error)

    def raise_error(self):
        """Raise the error a read of this value gets: for a step out of memory, the same
        ``torch.OutOfMemoryError``; else the original type where it takes a message
        (``StepFailedError`` otherwise), saying that the step failed and why."""
        error = self.error
        if isinstance(error, (torch.OutOfMemoryError, StepFailedError)):
            raise type(error)(*error.args)
        message = (f"torchspmd: this tensor has no value: the step that was to compute it "
                   f"failed ({type(error).__name__}: {error}). Other tensors are not affected; "
                   "compute this one again.")
        try:
            again = type(error)(message)
        except Exception:  # noqa: BLE001  (an exception type that takes other arguments)
            again = StepFailedError(message)
        if not isinstance(again, Exception) or str(again) != message:
            again = StepFailedError(message)
        raise again from error

    def __getattr__(self, name):
        self.raise_error()


def _detached(error: BaseException) -> BaseException:
    """A copy of ``error`` without its traceback (nor the errors chained to it).

    A failed value lives as long as its tensor, and a traceback keeps alive every frame
    it passed through, with their locals: the step's other tensors, which would then
    never be freed, and whose pending work every later ``sync()`` would still run.
    """
    try:
        detached = copy.copy(error)
    except Exception:  # noqa: BLE001  (an exception type that cannot be rebuilt)
        detached = StepFailedError(f"{type(error).__name__}: {error}")
    detached.__traceback__ = None
    detached.__cause__ = detached.__context__ = None
    return detached


def is_failed(array) -> bool:
    """Whether ``array`` (an entry of ``Node.arrays``) stands for a failed step's value."""
    return type(array) is FailedValue


def mark_failed(roots: list[Node], failed: FailedValue) -> None:
    """Make ``roots`` (pending nodes of a step that failed) leaves whose values raise
    ``failed``'s error when used; roots already computed are left as they are."""
    for root in roots:
        if not root.is_leaf:
            root.materialized([failed] * len(root.sig.outputs))
