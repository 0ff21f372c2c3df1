"""``torch.utils.checkpoint`` recomputes from fenced inputs on the spmd device, so it saves memory.

A step is one XLA program. The recomputation that checkpointing runs in the backward pass
is, to XLA, the forward's own expression again: common-subexpression elimination merges
them, and the activations checkpointing meant to drop stay alive. PyTorch/XLA's
checkpoint puts the recomputation's inputs through an optimization barrier; here
:func:`install` does the same inside PyTorch's own ``torch.utils.checkpoint`` (both
``use_reentrant`` settings, so Hugging Face's ``gradient_checkpointing_enable()`` too):
the inputs it hands to the recomputation are passed through
``lowering/barrier.py::OPTIMIZATION_BARRIER_AFTER`` first, after the value the backward
pass recorded last (so XLA can neither merge the recomputation with the forward nor run
it before the backward pass reaches the block). Values are unchanged; CPU and other
tensors are left alone. Example::

    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # x on "spmd"
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint as torch_checkpoint

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.record import latest_node, meta_of, record_binary, record_unary
from torchspmd.lowering.barrier import OPTIMIZATION_BARRIER, OPTIMIZATION_BARRIER_AFTER

__all__ = ["fence", "install"]


def _backward_anchor():
    """A value the backward pass has just computed (the gradient reaching the checkpointed
    block, typically), or ``None`` outside ``backward()``."""
    if torch._C._current_graph_task_id() == -1:
        return None
    node = latest_node()
    if node is None or node.is_leaf or node.sig.outputs[0] is None:
        return None
    meta = node.sig.outputs[0]
    if not meta.dtype.is_floating_point or 0 in meta.shape:
        return None  # the fence's predicate needs a float element (lowering/barrier.py)
    return (node, 0)


def fence(x, after=None):
    """``x`` through an optimization barrier if it is an spmd tensor (same value, no
    autograd history, same ``requires_grad``), available only once ``after`` (a graph
    value) is computed; anything else unchanged."""
    if not isinstance(x, SpmdTensor):
        return x
    if after is None:
        value = record_unary(OPTIMIZATION_BARRIER, x._h.value())
    else:
        value = record_binary(OPTIMIZATION_BARRIER_AFTER, x._h.value(), after)
    return SpmdTensor(Handle.new(value, meta_of(value)), requires_grad=x.requires_grad)


def fence_for_recomputation(inputs):
    """Each spmd tensor of ``inputs`` fenced, after the backward pass's latest value:
    XLA can neither merge the recomputation with the forward nor run it early."""
    after = _backward_anchor()
    return [fence(x, after) if isinstance(x, torch.Tensor) else x for x in inputs]


def _fenced_frame_init(init):
    """``_CheckpointFrame.__init__`` (use_reentrant=False), its ``recompute_fn`` given the
    saved inputs fenced. The frame calls ``recompute_fn(*saved_inputs)`` in every PyTorch
    since 2.11 (2.13 reads them with ``get_inputs``, 2.11 from its ``input_saver``), so
    wrapping the function the frame is built with covers both."""
    @functools.wraps(init)
    def wrapper(self, recompute_fn, *args, **kwargs):
        def fenced_recompute(*inputs):
            return recompute_fn(*fence_for_recomputation(inputs))

        init(self, fenced_recompute, *args, **kwargs)

    return wrapper


def _fenced_detach_variable(detach_variable):
    """``detach_variable`` (use_reentrant=True detaches the saved inputs with it), fenced."""
    @functools.wraps(detach_variable)
    def wrapper(inputs):
        if isinstance(inputs, tuple):
            inputs = tuple(fence_for_recomputation(inputs))
        return detach_variable(inputs)

    return wrapper


def install() -> None:
    """Fence checkpoint recomputation (idempotent)."""
    frame = torch_checkpoint._CheckpointFrame
    if not getattr(frame.__init__, "_torchspmd_fenced", False):
        frame.__init__ = _fenced_frame_init(frame.__init__)
        frame.__init__._torchspmd_fenced = True
    if not getattr(torch_checkpoint.detach_variable, "_torchspmd_fenced", False):
        torch_checkpoint.detach_variable = _fenced_detach_variable(torch_checkpoint.detach_variable)
        torch_checkpoint.detach_variable._torchspmd_fenced = True
