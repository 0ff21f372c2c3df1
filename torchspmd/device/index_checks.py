"""Index-range checks inside the graph, on by default: an index out of range raises later.

XLA never faults on an index (reads clamp or fill, writes are dropped), so a program with a
bad index (a tokenizer with more ids than the embedding has rows) would silently train on
garbage. Each indexing op (``x[idx]``, ``x[idx] = v``, ``gather``, ``scatter*``,
``index_select``, ``index_add_``/``index_copy_``/``index_fill_``, ``embedding``, ``take``)
also records, in the same graph, whether any of its indices is out of range; the flags of
one graph are folded into one int32 scalar (the number of the first failing op, 0 if
none), an extra output of the program. Nothing waits for it: it is read after a later
``sync()`` once the program is done, or at the next host read (which waits anyway), like
CUDA's asynchronous device-side asserts, and raises an ``IndexError`` naming the op. The
error leaves every tensor readable. ``torchspmd.compile`` steps return the flag too and
raise after the call.

Off with ``TORCHSPMD_INDEX_CHECKS=0`` in the environment or
``torchspmd.debug.index_checks(False)``. For the exact line, ``TORCHSPMD_CHECK_INDICES=1``
(``device/bounds.py``) reads every index to the host before its op: precise and slow.

Example::

    emb = torch.nn.Embedding(128, 8).to("spmd")
    out = emb(torch.tensor([130], device="spmd"))
    out.sum().item()   # IndexError: aten.embedding: index out of range (>= 128 or < 0) ...
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from torchspmd.runtime import hooks

__all__ = ["enabled", "set_enabled", "note", "fold", "take_flag", "restore_flag",
           "watch_tensor"]


@dataclass(eq=False)  # by identity: comparing the tensors would be a device op and a read
class _Flag:
    """A graph's folded flag (an int32 scalar spmd tensor) and the op message per code."""

    tensor: torch.Tensor
    messages: list[str]
    where: str = "a graph run at sync() or a host read"


@dataclass
class _State:
    on: bool = os.environ.get("TORCHSPMD_INDEX_CHECKS", "1") != "0"
    open: _Flag | None = None  # the pending graph's flag, folded as ops are recorded
    watched: list[_Flag] = field(default_factory=list)  # run (or running), not read yet
    busy: bool = False  # recording a check's own ops


_STATE = _State()  # registry: the checks of this process


def enabled() -> bool:
    """Whether indexing ops record an in-graph range check (default on)."""
    return _STATE.on


def set_enabled(on: bool = True) -> None:
    """Turn the in-graph index checks on or off (default from ``TORCHSPMD_INDEX_CHECKS``)."""
    _STATE.on = bool(on)


def _dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def _size(x, dim) -> int:
    return x.shape[_dim(dim, x.dim())] if x.dim() else 1


def _advanced(x, indices, *_, **__):
    return [(index, x.shape[p], True) for p, index in enumerate(indices) if p < x.dim()]


def _along(x, dim, index, *_, **__):
    return [(index, _size(x, dim), False)]


_INDICES = {  # aten op name (in-place and out variants too) -> [(index, size, negatives ok)]
    "index": _advanced,
    "index_put": _advanced,
    "_index_put_impl": _advanced,
    "gather": _along,
    "scatter": _along,
    "scatter_add": _along,
    "scatter_reduce": _along,
    "index_add": _along,
    "index_select": _along,
    "index_fill": _along,
    "index_copy": _along,
    "index_reduce": _along,
    "embedding": lambda weight, indices, *_, **__: [(indices, weight.shape[0], False)],
    "take": lambda x, index, *_, **__: [(index, x.numel(), True)],
}


_SPECS: dict = {}  # registry: id(overload) -> (overload, its _INDICES entry or None, name)


def _spec(func):
    found = _SPECS.get(id(func))
    if found is None or found[0] is not func:
        name = func._schema.name.split("::")[-1]
        name = name[:-1] if name.endswith("_") and name[:-1] in _INDICES else name
        found = _SPECS[id(func)] = (func, _INDICES.get(name), name)
    return found[1], found[2]


def note(func, args: tuple, kwargs: dict) -> None:
    """Fold "an index of ``func`` is out of range" into the pending graph's flag."""
    spec, name = _spec(func)
    if spec is None or _STATE.busy:
        return
    checks = [(i, size, neg) for i, size, neg in spec(*args, **kwargs)
              if isinstance(i, torch.Tensor) and i.device.type == "spmd" and i.numel()
              and not (i.dtype == torch.bool or i.is_floating_point())]
    if not checks:
        return
    _STATE.busy = True
    try:
        with torch.no_grad():
            bad = None
            for index, size, negatives in checks:
                low = -size if negatives else 0
                out = (index.lt(low) | index.ge(size)).any()
                bad = out if bad is None else bad | out
            flag = _open_flag(index.device)
            ranges = " / ".join(f">= {size} or < {-size if negatives else 0}"
                                for _, size, negatives in checks)
            flag.messages.append(f"aten.{name}: index out of range ({ranges})")
            code = len(flag.messages)
            flag.tensor = torch.where(bad & flag.tensor.eq(0), code, flag.tensor)
    finally:
        _STATE.busy = False


def _open_flag(device) -> _Flag:
    """The pending graph's flag, made (on ``device``) if there is none."""
    if _STATE.open is None:
        _STATE.open = _Flag(torch.zeros((), dtype=torch.int32, device=device), [])
    return _STATE.open


def fold(code: torch.Tensor, messages: Sequence[str]) -> None:
    """Fold another flag into the pending graph's: ``code`` (an int32 spmd scalar) is 0, or
    the number of the failing op's message in ``messages``. A loop traced once and run on
    the device keeps its body's flag this way (``generation/device_loop.py``).

    Example::

        fold(loop_flag, ["aten.embedding: index out of range (>= 128 or < 0)"])
    """
    if not messages or not _STATE.on:
        return
    with torch.no_grad():  # (no indexing op here: nothing for ``note`` to check)
        flag = _open_flag(code.device)
        offset = len(flag.messages)
        flag.messages.extend(messages)
        flag.tensor = torch.where(flag.tensor.eq(0) & code.ne(0), code + offset, flag.tensor)


def take_flag() -> _Flag | None:
    """The pending graph's flag, which the caller now owns (``torchspmd.compile``)."""
    flag, _STATE.open = _STATE.open, None
    return flag


def restore_flag(flag: _Flag | None) -> None:
    """Put back a flag taken by :func:`take_flag` (it is pending again)."""
    _STATE.open = flag


def watch_tensor(tensor: torch.Tensor, messages: list[str], where: str) -> None:
    """Read a flag ``tensor`` (a step's output) after a later run, and raise if it is set."""
    _STATE.watched.append(_Flag(tensor, messages, where))


_RUNNING = -1  # ``_value``: launched, not finished


def _value(flag: _Flag, blocking: bool):
    """The flag's value if its program has run (and, unless ``blocking``, finished); None
    if it has not run, ``_RUNNING`` if it is still running."""
    node, index = flag.tensor._h.value()
    if node.arrays is None:
        return None  # not run yet
    array = node.arrays[index]
    try:
        if not blocking and not array.is_ready():
            return _RUNNING
        return int(np.asarray(array))
    except Exception:  # noqa: BLE001  (the run failed: its own error was raised to its caller)
        return 0


def _after_run(blocking: bool) -> None:
    flag = _STATE.open
    if flag is not None and flag.tensor._h.value()[0].arrays is not None:  # it ran now
        _STATE.open = None
        _STATE.watched.append(flag)
    for flag in list(_STATE.watched):
        code = _value(flag, blocking)
        if code is None:
            continue
        if code == _RUNNING:
            # Programs finish in the order they were launched: the later flags are not
            # ready either (a loop that launches ahead would otherwise look at every
            # running flag on every call).
            break
        _STATE.watched.remove(flag)
        if code:
            _STATE.watched.clear()  # one error per bad program; the rest is stale
            raise IndexError(
                f"{flag.messages[code - 1]} in {flag.where}; XLA clamps such reads and drops "
                "such writes, so values computed from it are wrong. To find the line, run with "
                "TORCHSPMD_CHECK_INDICES=1 (each indexing op checks its indices on the host "
                "before it runs, slowly); to turn this check off, TORCHSPMD_INDEX_CHECKS=0 or "
                "torchspmd.debug.index_checks(False).")


hooks.AFTER_RUN.append(_after_run)
