"""Ops whose output shape depends on the data: one host read of a size, then static ops.

``nonzero``, ``x[mask]``, ``masked_select``, ``unique``, ``unique_consecutive``,
``bincount``, ``repeat_interleave`` with a tensor of repeats: each computes the size it
needs on the device, reads that one value (:func:`~torchspmd.device.host.host_read`, a
host sync that runs what is pending for it, and refuses inside a captured step), and
records a static-shape op with the size fixed (``nonzero_static``, the pseudo-ops of
``lowering/sized.py``). The data itself stays on the device.

Dispatch asks :data:`DATA_DEPENDENT` for each op: an entry whose ``applies`` is true for
the call runs instead of the op (``x[idx]`` with integer indices stays an ordinary op).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchspmd.device.host import host_read
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TENSOR
from torchspmd.lazy.record import freeze, record
from torchspmd.lowering.sized import BINCOUNT, UNIQUE, UNIQUE_COUNT

aten = torch.ops.aten

_MASKS = (torch.bool, torch.uint8)


@dataclass(frozen=True)
class DataDependentOp:
    """How to run an op whose output shape depends on data: ``run`` where ``applies``."""

    run: Callable
    applies: Callable = lambda *args, **kwargs: True


def _size(t: torch.Tensor, op_name: str) -> int:
    """The Python int in 0-d ``t`` (spmd: one host sync; a CPU tensor: already there)."""
    if isinstance(t, SpmdTensor):
        return int(host_read(t, op_name))
    return int(t)


def _record(op, args: tuple) -> list[SpmdTensor]:
    """Record pseudo-op ``op(*args)`` (spmd tensors and static values); its outputs."""
    tensors = [a for a in args if isinstance(a, SpmdTensor)]
    template = tuple(TENSOR if isinstance(a, SpmdTensor) else freeze(a) for a in args)
    node = record(op, template, (), tuple(t._h.value() for t in tensors),
                  tuple(t._h.meta for t in tensors))
    return [SpmdTensor(Handle.new((node, i), m)) for i, m in enumerate(node.sig.outputs)]


# --- nonzero and boolean masks -------------------------------------------------------------

def nonzero(x: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero(x)``: the count read once, then ``nonzero_static`` of that size."""
    return aten.nonzero_static(x, size=_size(aten.count_nonzero(x), "torch.nonzero"))


def _has_mask(x, indices, *rest) -> bool:
    return any(i is not None and i.dtype in _MASKS for i in indices)


def index_with_masks(x: torch.Tensor, indices: list) -> torch.Tensor:
    """``x[mask]``: each boolean mask becomes the integer indices of its true elements."""
    converted, dim = [], 0
    for index in indices:
        if index is None or index.dtype not in _MASKS:
            converted.append(index)
            dim += 1
            continue
        if index.dim() == 0:  # x[True] adds a dim of size 1 (0 for False)
            x, index = x.unsqueeze(dim), index.reshape(1)
        _check_mask(x, index, dim, len(converted))
        # A CPU mask's true elements are known on the host: no device read for them.
        found = index.nonzero() if index.device.type == "cpu" else nonzero(index)
        converted.extend(found.unbind(1))
        dim += index.dim()
    return aten.index.Tensor(x, converted)


def _check_mask(x, mask, dim: int, position: int) -> None:
    covered = list(x.shape[dim:dim + mask.dim()])
    if list(mask.shape) != covered or dim + mask.dim() > x.dim():
        raise IndexError(f"The shape of the mask {list(mask.shape)} at index {position} does "
                         f"not match the shape of the indexed tensor {list(x.shape)} at index "
                         f"{dim}")


def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.masked_select(x, mask)``: the elements where ``mask`` (broadcast) is true."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    x, mask = torch.broadcast_tensors(x, mask)
    return index_with_masks(x.reshape(-1), [mask.reshape(-1)])


# --- unique --------------------------------------------------------------------------------

def _unique(x, dim, consecutive: bool, return_inverse: bool, return_counts: bool, name: str):
    if dim is not None and x.dim() == 0:
        raise IndexError(f"{name}: dim {dim} is out of range for a 0-d tensor")
    (count,) = _record(UNIQUE_COUNT, (x, dim, consecutive))
    size = _size(count, name)
    return tuple(_record(UNIQUE, (x, size, dim, consecutive, return_inverse, return_counts)))


def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    """``torch.unique(x)`` (values always come out sorted; ``sorted=False`` allows any order)."""
    return _unique(x, None, False, return_inverse, return_counts, "torch.unique")


def unique_legacy(x, sorted=True, return_inverse=False):
    """``aten::_unique``: values and inverse indices."""
    return _unique(x, None, False, return_inverse, False, "torch.unique")[:2]


def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    """``torch.unique(x, dim=d)``: distinct slices along ``dim``, sorted."""
    return _unique(x, dim, False, return_inverse, return_counts, "torch.unique")


def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """``torch.unique_consecutive``: runs of equal elements (or slices) collapse to one."""
    return _unique(x, dim, True, return_inverse, return_counts, "torch.unique_consecutive")


# --- counting and repeating ----------------------------------------------------------------

def bincount(x, weights=None, minlength=0):
    """``torch.bincount``: one host read of the input's range sizes the output."""
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    length = minlength
    if x.numel() > 0:
        low, high = host_read(torch.stack([x.min(), x.max()]), "torch.bincount").tolist()
        if low < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(minlength, high + 1)
    return _record(BINCOUNT, (x, weights, length))[0]


def repeat_interleave(repeats, output_size=None):
    """``repeat_interleave(repeats)`` with a tensor of repeats: the total read once."""
    total = _size(repeats.sum(), "torch.repeat_interleave")
    return aten.repeat_interleave.Tensor(repeats, output_size=total)


DATA_DEPENDENT: dict = {
    aten.nonzero.default: DataDependentOp(nonzero),
    aten.index.Tensor: DataDependentOp(index_with_masks, _has_mask),
    aten.masked_select.default: DataDependentOp(masked_select),
    aten._unique2.default: DataDependentOp(unique2),
    aten._unique.default: DataDependentOp(unique_legacy),
    aten.unique_dim.default: DataDependentOp(unique_dim),
    aten.unique_consecutive.default: DataDependentOp(unique_consecutive),
    aten.bincount.default: DataDependentOp(bincount),
    aten.repeat_interleave.Tensor: DataDependentOp(
        repeat_interleave, lambda repeats, output_size=None: output_size is None),
}
