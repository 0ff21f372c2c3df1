"""Ops on spmd tensors that are not recorded as they come: they run now, or take a path
of their own (copies between devices, host reads, clones that keep a sharding, batch
norm's in-place statistics).

``install()`` registers each with the dispatcher (``dispatch.register_handler``).

Example::

    install()
    t.item()      # aten._local_scalar_dense -> runs what t needs, reads one number
"""

from __future__ import annotations

import torch

from torchspmd.device import resize
from torchspmd.device.aten_calls import host_value, record_call, wrap_outputs, wrap_views
from torchspmd.device.dispatch import _assign, register_handler
from torchspmd.device.host import to_cpu
from torchspmd.device.tensor import SpmdTensor, check_device_index
from torchspmd.lazy.annotation import annotation, sharded_value, unannotated
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import Node, TensorMeta
from torchspmd.lazy import provenance
from torchspmd.lazy.provenance import refuse_host_read
from torchspmd.lazy.record import record_unary
from torchspmd.lazy.views import OVERLAP_MESSAGE, memory_order, pointwise_reads_overwritten
from torchspmd.lazy.views import storage_offset as storage_offset_of
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT

aten = torch.ops.aten


def _to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    check_device_index(device)
    if device is not None and torch.device(device).type != "spmd":
        out = to_cpu(t) if isinstance(t, SpmdTensor) else t
        return out.to(device=device, dtype=dtype or out.dtype)
    if dtype is None or dtype == t.dtype:
        return wrap_outputs(aten.clone.default, record_call(aten.clone.default, (t,), {}))
    node = record_call(aten._to_copy.default, (t,), {"dtype": dtype})
    return wrap_outputs(aten._to_copy.default, node)


def _copy_(dst, src, non_blocking=False):
    if not isinstance(dst, SpmdTensor):
        return dst.copy_(to_cpu(src))
    if isinstance(src, SpmdTensor):
        if src._h.storage is dst._h.storage and pointwise_reads_overwritten(
                dst._h.storage.meta, dst._h.view, src._h.view, copy=True):
            raise RuntimeError(OVERLAP_MESSAGE)  # CPU's result would depend on its order
        value = unannotated(src._h.value())  # dst keeps its own annotation, not src's
    else:
        if src.dtype != dst.dtype or src.shape != dst.shape:  # else x.to(device): as it is
            provenance.read_host(src)  # the converted copy below is not what may change
            src = src.to(dtype=dst.dtype).expand(dst.shape)
        value = host_value(src)  # a contiguous copy
    _assign(dst, value)
    return dst


def _copy_from(src, dst, non_blocking=False):
    return _copy_(dst, src)


def _local_scalar_dense(t):
    refuse_host_read("Tensor.item() (also float(t), bool(t), `if t:`, f\"{t:.4f}\", a tensor "
                     "used as a Python number)")
    return to_cpu(t).item()


def _equal(a, b):
    refuse_host_read("torch.equal")
    a = to_cpu(a) if isinstance(a, SpmdTensor) else a
    b = to_cpu(b) if isinstance(b, SpmdTensor) else b
    return torch.equal(a, b)


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training updates the running stats in place, though its schema does
    not say so: record the functional form and assign the new stats."""
    if not (training and running_mean is not None):
        node = record_call(aten.native_batch_norm.default,
                           (input, weight, bias, running_mean, running_var, training,
                            momentum, eps), {})
        out, save_mean, save_invstd = wrap_outputs(aten.native_batch_norm.default, node)
        if not training:  # no batch statistics: empty, as PyTorch's kernels return them
            empty = TensorMeta((0,), (1,), save_mean.dtype)
            save_mean = SpmdTensor(resize.allocate_handle(empty))
            save_invstd = SpmdTensor(resize.allocate_handle(empty))
        return out, save_mean, save_invstd
    functional = aten._native_batch_norm_legit_functional.default
    node = record_call(functional, (input, weight, bias, running_mean, running_var, training,
                                   momentum, eps), {})
    _assign(running_mean, (node, 3))
    _assign(running_var, (node, 4))
    return tuple(SpmdTensor(Handle.new((node, i), node.sig.outputs[i])) for i in range(3))


def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """A Python bool: computed on the device, one value read back."""
    refuse_host_read("torch.allclose")
    return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan).all().item())


def _lift_fresh(t):
    return t


def _clone(t, *, memory_format=None):
    """A copy that shows ``t``'s sharding at once, as PyTorch/XLA's ``clone`` copies the spec.

    The copy is constrained to ``t``'s annotation, or to the layout XLA gave ``t`` when it
    was computed, so ``get_sharding(t.clone())`` (and ``copy.deepcopy``) equals
    ``get_sharding(t)`` before anything runs.
    """
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    node = record_call(aten.clone.default, (t,), kwargs)
    value = (node, 0)
    sharding = _layout(sharded_value(t._h))
    if sharding is not None and len(sharding.device_set) > 1:
        value = record_unary(SHARDING_CONSTRAINT, value, sharding)
    return SpmdTensor(Handle.new(value, node.sig.outputs[0]))


def _layout(value: tuple[Node, int]):
    """``value``'s annotation, else the sharded layout XLA computed it in, else None.

    A computed value XLA left replicated gives none: constraining its copy would only
    keep XLA from choosing a better layout for the copy.
    """
    sharding = annotation(value)
    node, index = value
    if sharding is None and node.arrays is not None and node.sig is not None \
            and node.sig.op is not None and not node.arrays[index].sharding.is_fully_replicated:
        sharding = node.arrays[index].sharding
    return sharding


def _set_(dst, src):
    """``dst.set_(src)``: ``dst`` shares ``src``'s storage from now on, as ``dst.data = src``
    (``SpmdTensor.data``, which checks ``src``)."""
    dst.data = src
    return dst


def _set_storage_(dst, *args, **kwargs):
    raise NotImplementedError(
        "torchspmd: Tensor.set_ with a storage, an offset or no source is not supported on "
        "the spmd device (its data lives in XLA buffers, not in a PyTorch storage); "
        "t.set_(other_tensor) and t.data = other_tensor are")


def _is_pinned(t, device=None) -> bool:
    """``t.is_pinned()``: device memory is never pinned host memory (as on CUDA)."""
    return False


def _as_strided(t, size, stride, storage_offset=None):
    """``as_strided`` reads ``t``'s *storage* in memory order, whatever view ``t`` is.

    The lowering gathers from its input's elements in row-major order, which is the
    storage's memory only for a base laid out row-major. Any other input (a view such as
    ``x.t()`` or ``x[1:]``, a channels-last or ``empty_like(x.t())`` storage) is first
    replaced by its whole storage, permuted into memory order, with the view's own
    offset as the default offset (before, ``x.t().as_strided(...)`` read the transposed
    values as if they were memory)."""
    handle = t._h
    meta = handle.storage.meta
    order = memory_order(meta)
    row_major = order is not None and order == sorted(order)
    if not handle.whole or not row_major:
        if order is None:
            raise NotImplementedError(
                "torchspmd: as_strided of a tensor whose storage has gaps or overlapping "
                "elements is not supported; call it on a .contiguous() copy")
        own = storage_offset_of(meta, handle.view)
        if storage_offset is None:
            storage_offset = own
        elif own and t.requires_grad:
            # Autograd's as_strided backward reads the input's offset from PyTorch's own
            # record of the tensor, which is 0 for spmd views: its gradient would land
            # ``own`` elements off.
            raise NotImplementedError(
                f"torchspmd: as_strided with an explicit storage_offset of a view that "
                f"starts {own} elements into its storage, with autograd, is not supported: "
                "call it on the base tensor (the offset is relative to the storage either "
                "way), or leave storage_offset out")
        t = SpmdTensor(Handle(handle.storage, meta, ()))  # the storage itself
        if not row_major:
            t = aten.permute.default(t, order)
    args = (t, list(size), list(stride), storage_offset)
    return wrap_views(aten.as_strided.default, args, record_call(aten.as_strided.default, args, {}))


def _as_strided_(t, size, stride, storage_offset=None):
    """``t.as_strided_(...)``: ``t`` itself becomes that view of its storage (see
    :func:`_as_strided`)."""
    view = _as_strided(t, size, stride, storage_offset)
    t._h = view._h
    with torch._C._DisableTorchDispatch():
        torch.ops.aten.as_strided_.default(t, view.shape, view.stride())
    return t


def _as_strided_scatter(t, src, size, stride, storage_offset=None):
    """The lowering scatters into ``t``'s elements in row-major order, which is the
    memory PyTorch scatters into (a copy of ``t`` laid out as ``t``) only when ``t`` is
    row-major: refuse the others rather than scatter elsewhere."""
    meta = t._h.meta
    order = memory_order(meta)
    if order is not None and order != sorted(order):
        raise NotImplementedError(
            "torchspmd: as_strided_scatter into a tensor laid out other than row-major "
            f"(strides {tuple(meta.stride)}) is not supported: call it on input.contiguous()")
    args = (t, src, list(size), list(stride), storage_offset)
    return wrap_outputs(aten.as_strided_scatter.default,
                        record_call(aten.as_strided_scatter.default, args, {}))


def _nested_tensor_from_mask_left_aligned(t, mask) -> bool:
    """Always False: ``nn.TransformerEncoder`` asks this in eval with a padding mask to
    pick its nested-tensor path, which the spmd device does not have (nested tensors
    have no XLA layout). Answered without reading the mask, the encoder runs its
    layers on the padded batch, as on a device outside PyTorch's fast-path list
    (PyTorch/XLA's): the same values at the real positions; the padded positions hold
    computed values where the nested path gives zeros (``docs/limits.md``)."""
    return False


IMMEDIATE = {
    aten.is_pinned.default: _is_pinned,
    aten.set_.source_Tensor: _set_,
    aten.set_.default: _set_storage_,
    aten.set_.source_Storage: _set_storage_,
    aten.set_.source_Storage_storage_offset: _set_storage_,
    aten.set_.source_Tensor_storage_offset: _set_storage_,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._copy_from.default: _copy_from,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.equal.default: _equal,
    aten.as_strided.default: _as_strided,
    aten.as_strided_.default: _as_strided_,
    aten.as_strided_scatter.default: _as_strided_scatter,
    aten._nested_tensor_from_mask_left_aligned.default: _nested_tensor_from_mask_left_aligned,
    aten.allclose.default: _allclose,
    aten.lift_fresh.default: _lift_fresh,
    aten.clone.default: _clone,
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm,  # same arguments and outputs
}


def install() -> None:
    """Register every op above with the dispatcher (idempotent)."""
    for op, handler in IMMEDIATE.items():
        register_handler(op, handler)
