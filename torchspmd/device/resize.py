"""Giving an spmd tensor storage of another size: ``resize_``, ``resize_as_``, ``out=``.

As in PyTorch, a resized tensor keeps its contents in (contiguous) storage order: the
first elements stay, elements beyond the old size are unspecified (zeros here). Shrinking
keeps the storage (views of it see later writes). Growing moves the tensor to a new
storage: views taken before it keep the old one (in PyTorch the storage grows in place and
they see later writes; a view's derivation here is fixed to its base's old shape).

Example: ``t.resize_(25, 5)`` on a contiguous ``(5, 5, 5)`` tensor keeps all 125 values.
"""

from __future__ import annotations

import math

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TensorMeta
from torchspmd.lazy.record import record

aten = torch.ops.aten


def contiguous_strides(shape) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (PyTorch's, with size-0 dims counted as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def allocate_handle(meta: TensorMeta) -> Handle:
    """A handle whose value is zeros of ``meta`` (the unspecified contents of ``empty``)."""
    node = record(aten.zeros.default, (meta.shape,), (("dtype", meta.dtype),), (), ())
    return Handle.new((node, 0), meta)


def fresh_storage(t: SpmdTensor, meta: TensorMeta) -> None:
    """Give ``t`` a fresh storage of ``meta``'s shape (its old contents are dropped)."""
    meta = TensorMeta(meta.shape, contiguous_strides(meta.shape), t.dtype)
    _rebind(t, allocate_handle(meta))


def _rebind(t: SpmdTensor, handle: Handle) -> None:
    meta = handle.meta
    if math.prod(meta.shape) * t.element_size() > torch.Tensor.untyped_storage(t).nbytes():
        # PyTorch's placeholder storage behind the wrapper is as large as the tensor was
        # made and cannot grow: take a placeholder of the new size (``.data``'s setter
        # swaps it in, keeping the Python object and its autograd flags).
        torch.Tensor.data.__set__(t, SpmdTensor(handle))
    t._h = handle
    with torch._C._DisableTorchDispatch():
        torch.ops.aten.as_strided_.default(t, meta.shape, meta.stride)


def resize_(t, size, memory_format=None):
    """``t.resize_(*size)``: the first elements (in storage order) stay, new ones are 0."""
    size = tuple(size)
    if size == tuple(t.shape):
        return t
    if t.numel() == 0:
        fresh_storage(t, TensorMeta(size, contiguous_strides(size), t.dtype))
        return t
    if not t.is_contiguous():
        raise NotImplementedError(
            "torchspmd: resize_ of a non-contiguous spmd tensor is not supported (its "
            "storage order is not its element order); call t = t.contiguous() first.")
    numel = math.prod(size)
    flat = t.reshape(-1)
    if numel <= flat.numel():  # the same storage: views of it see later writes
        _rebind(t, flat[:numel].view(size)._h)
        return t
    grown = torch.cat([flat, flat.new_zeros(numel - flat.numel())]).reshape(size)
    _rebind(t, Handle.new(grown._h.value(), TensorMeta(size, contiguous_strides(size), t.dtype)))
    return t


def resize_as_(t, template, *, memory_format=None):
    """``t.resize_as_(template)``: ``t.resize_(template.shape)``."""
    return resize_(t, template.shape)
