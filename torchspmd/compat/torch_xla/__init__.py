"""``torch_xla`` as torchspmd serves it: the device, ``sync``, ``compile``, seeds.

Example (after ``torchspmd.compat.install()``)::

    import torch_xla
    x = torch.ones(4, device=torch_xla.device())
    torch_xla.sync()
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

import torchspmd
from torchspmd.compat import step_closures
from torchspmd.compat.errors import unsupported

from . import _ops  # noqa: F401  (torch.ops.xla.*, defined when torch_xla is imported)

__version__ = "2.9.0+torchspmd"


def device(n: int | None = None) -> torch.device:
    """The spmd device (``xla:0``): one virtual device spanning every physical device."""
    if n not in (None, 0):
        unsupported(f"torch_xla.device({n})", "under SPMD there is one virtual device; use "
                    "torch_xla.device() and a Mesh to place work on some devices")
    return torchspmd.device()


def devices() -> list[torch.device]:
    """``[torch_xla.device()]``: the one virtual device."""
    return [torchspmd.device()]


def device_count() -> int:
    """1: under SPMD a process sees one virtual device."""
    return 1


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """``torchspmd.sync``, then the step closures queued by ``xm.add_step_closure``."""
    torchspmd.sync(wait=wait)
    step_closures.run()


def manual_seed(seed: int, device: Any = None) -> None:
    """``torchspmd.manual_seed``."""
    torchspmd.manual_seed(seed)


def compile(f: Callable | None = None, full_graph: bool = False, name: str | None = None,
            num_different_graphs_allowed: int | None = None) -> Any:
    """``torch_xla.compile``: ``full_graph=True`` is ``torchspmd.compile`` (traced once,
    replayed as one XLA call; a host read inside raises); otherwise ``f`` runs lazily and
    its graph runs at its end (``sync``). Without ``f``: a context manager that syncs."""
    if num_different_graphs_allowed is not None:
        unsupported("torch_xla.compile(num_different_graphs_allowed=...)",
                    "read torchspmd.metrics()['step_captures'] to count captures")
    if f is None:
        return _syncing()
    step = torchspmd.compile(f) if full_graph else f

    @functools.wraps(f)
    def call(*args, **kwargs):
        step_closures.EAGER.compiling += 1
        try:
            out = step(*args, **kwargs)
        finally:
            step_closures.EAGER.compiling -= 1
        if not full_graph:
            torchspmd.sync()
        step_closures.run()
        return out
    return call


@contextlib.contextmanager
def _syncing():
    yield
    sync()


@contextlib.contextmanager
def step():
    """``with torch_xla.step(): ...``: the block's work runs as its own graph (``sync``
    before and after it)."""
    sync()
    try:
        yield
    finally:
        sync()


from . import _XLAC, amp, core, debug, distributed, experimental, runtime, utils  # noqa: E402,F401
