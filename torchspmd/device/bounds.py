"""Checked indexing: out-of-range indices raise as on the CPU, instead of what XLA does.

XLA never faults on an index: reads clamp it into range (``x[idx]``, ``gather``, ``take``)
or give a fill value (``index_select`` and ``embedding``: NaN for floats), and writes drop
the update (``x[idx] = v``, ``index_put_``, ``scatter``, ``index_add_``...). That is fast,
and wrong for a program with a bug. With ``TORCHSPMD_CHECK_INDICES=1`` in the environment,
or ``torchspmd.debug.check_indices(True)``, each indexing op first reads its index tensor
to the host (running the little graph that computes it) and raises PyTorch's error for
the first index out of range. It is slow: for debugging.

Example::

    torchspmd.debug.check_indices(True)
    x = torch.zeros(3, device="spmd")
    x[torch.tensor([5], device="spmd")]   # IndexError: index 5 is out of bounds for dimension 0 with size 3
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["set_enabled", "check"]

_STATE = {"on": os.environ.get("TORCHSPMD_CHECK_INDICES", "") not in ("", "0")}


def set_enabled(on: bool = True) -> None:
    """Turn index checking on or off (the default comes from ``TORCHSPMD_CHECK_INDICES``)."""
    _STATE["on"] = bool(on)


def _host(t) -> np.ndarray | None:
    """An index tensor's values on the host (``None`` for a missing or boolean index)."""
    if not isinstance(t, torch.Tensor) or t.dtype == torch.bool or t.is_floating_point():
        return None
    return t.cpu().numpy() if t.device.type != "cpu" else t.numpy()


def _out_of_range(values: np.ndarray | None, size: int, negatives: bool):
    """The first value outside ``[-size, size)`` (or ``[0, size)``), else None."""
    if values is None or values.size == 0:
        return None
    low = -size if negatives else 0
    bad = (values < low) | (values >= size)
    return values.reshape(-1)[int(np.argmax(bad.reshape(-1)))] if bad.any() else None


def _dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def _advanced(x, indices) -> None:
    """``x[indices]`` / ``x[indices] = v``: tensor ``indices[p]`` indexes dim ``p``."""
    for p, index in enumerate(indices):
        value = _out_of_range(_host(index), x.shape[p], negatives=True) if p < x.dim() else None
        if value is not None:
            raise IndexError(f"index {value} is out of bounds for dimension {p} with size "
                             f"{x.shape[p]}")


def _along(x, dim, index, error=RuntimeError, prefix="") -> None:
    """An op indexing ``x`` along ``dim`` with ``index`` (no negative indices)."""
    d = _dim(dim, x.dim())
    size = x.shape[d] if x.dim() else 1
    value = _out_of_range(_host(index), size, negatives=False)
    if value is not None:
        raise error(f"{prefix}index {value} is out of bounds for dimension {d} with size {size}")


def _in_self(index, size: int) -> None:
    if _out_of_range(_host(index), size, negatives=False) is not None:
        raise IndexError("index out of range in self")


def _take(x, index) -> None:
    value = _out_of_range(_host(index), x.numel(), negatives=True)
    if value is not None:
        raise IndexError(f"out of range: tried to access index {value} on a tensor of "
                         f"{x.numel()} elements.")


def _index_select(x, dim, index, *_, **__):
    _in_self(index, x.shape[_dim(dim, x.dim())] if x.dim() else 1)


def _index_fill(x, dim, index, *_, **__):
    _along(x, dim, index, IndexError)


def _index_copy(x, dim, index, *_, **__):
    _along(x, dim, index, IndexError, prefix="index_copy_(): ")


_CHECKS = {  # aten op name (in-place and out variants included) -> check(*args, **kwargs)
    "index": lambda x, indices, *_, **__: _advanced(x, indices),
    "index_put": lambda x, indices, *_, **__: _advanced(x, indices),
    "_index_put_impl": lambda x, indices, *_, **__: _advanced(x, indices),
    "gather": lambda x, dim, index, *_, **__: _along(x, dim, index),
    "scatter": lambda x, dim, index, *_, **__: _along(x, dim, index),
    "scatter_add": lambda x, dim, index, *_, **__: _along(x, dim, index),
    "scatter_reduce": lambda x, dim, index, *_, **__: _along(x, dim, index),
    "index_add": lambda x, dim, index, *_, **__: _along(x, dim, index),
    "index_select": _index_select,
    "index_fill": _index_fill,
    "index_copy": _index_copy,
    "index_reduce": _index_select,
    "embedding": lambda weight, indices, *_, **__: _in_self(indices, weight.shape[0]),
    "take": lambda x, index, *_, **__: _take(x, index),
}


def check(func, args: tuple, kwargs: dict) -> None:
    """Raise PyTorch's error if indexing op ``func`` is given an index out of range."""
    name = func._schema.name.split("::")[-1]
    checker = _CHECKS.get(name[:-1] if name.endswith("_") and name[:-1] in _CHECKS else name)
    if checker is not None:
        checker(*args, **kwargs)
