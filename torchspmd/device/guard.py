"""The spmd device's guard for PyTorch's C++ side, and exceptions raised inside ``backward()``.

PyTorch's guard for a Python backend (``torch._C._acc.DeviceGuard``) asks Python for its
device type on every device or stream switch, from C++. When Python code run by the
autograd engine raises (a backward op with no lowering, a backward hook), PyTorch throws
the error on without taking it off the thread first, and on its way out a stream guard
asks the device guard for its type: calling Python with an exception pending fails,
inside a ``noexcept`` function, and the process aborts ("terminate called without an
active exception").

So :class:`DeviceGuard.type_` first takes a pending exception off its thread (CPython's
``PyErr_Fetch``, through ctypes: any other call would fail while it is pending), keeps
it, and answers. PyTorch then reports "returned NULL without setting an exception" from
``backward()``; :func:`install` wraps the engine's entry point so that the kept exception
is raised instead, with its own traceback. The session keeps working afterwards.

Example::

    x = torch.randn(4, device="spmd", requires_grad=True)
    torch.nn.functional.hardshrink(x).sum().backward()
    # NotImplementedError: torchspmd: aten::hardshrink_backward is not supported ...
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch
import torch.autograd
import torch.autograd.graph

from torchspmd.runtime.metrics import COUNTERS

__all__ = ["DeviceGuard", "install"]

_PRIVATE_USE_1 = torch._C._autograd.DeviceType.PrivateUse1
_FETCH = ctypes.pythonapi.PyErr_Fetch  # no argtypes: converting arguments calls Python
_FETCH.restype = None
_DECREF = ctypes.pythonapi.Py_DecRef
_DECREF.restype = None

_THREAD = threading.local()  # per thread: where PyErr_Fetch writes (see _slots)
_KEPT: list[BaseException] = []  # exceptions taken off a thread, oldest first
_LOCK = threading.Lock()


class _Slots:
    """Three ``PyObject *`` slots for ``PyErr_Fetch`` and the pointers to pass it."""

    def __init__(self):
        self.slots = [ctypes.py_object() for _ in range(3)]
        self.refs = tuple(ctypes.byref(slot) for slot in self.slots)
        self.set = ctypes.c_void_p.from_buffer(self.slots[0])  # the type slot, as a pointer


def _slots() -> _Slots:
    slots = _THREAD.__dict__.get("slots")
    if slots is None:
        slots = _THREAD.slots = _Slots()
    return slots


class DeviceGuard(torch._C._acc.DeviceGuard):
    """The spmd device guard: one device (index 0), no streams; safe with an exception pending."""

    def type_(self):
        # The first thing done must work with an exception pending: a plain attribute
        # read, then the fetch (which clears it). Each thread's slots exist already: the
        # engine asks for the type when it enters a node, before anything can raise.
        try:
            refs = _THREAD.slots.refs
        except AttributeError:
            refs = _slots().refs
        _FETCH(*refs)
        if _THREAD.slots.set.value:
            _keep(_THREAD.slots)
        return _PRIVATE_USE_1


def _keep(slots: _Slots) -> None:
    """Turn the fetched (type, value, traceback) into an exception and keep it."""
    kind, value, traceback = (_own(slot) for slot in slots.slots)
    if not isinstance(value, BaseException):
        value = kind() if value is None else kind(value)
    with _LOCK:
        _KEPT.append(value.with_traceback(traceback))


def _own(slot: ctypes.py_object):
    """The object in ``slot`` (a reference PyErr_Fetch handed over), the slot emptied."""
    pointer = ctypes.c_void_p.from_buffer(slot)
    if not pointer.value:
        return None
    obj = slot.value  # a reference of our own
    _DECREF(slot)  # the one PyErr_Fetch gave
    pointer.value = None
    return obj


def _take() -> BaseException | None:
    with _LOCK:
        kept = _KEPT[0] if _KEPT else None
        _KEPT.clear()
    return kept


def install() -> None:
    """Make ``backward()``/``autograd.grad`` raise the exceptions the guard kept (idempotent)."""
    run = torch.autograd.graph._engine_run_backward
    if getattr(run, "_torchspmd", False):
        return

    @functools.wraps(run)
    def run_backward(*args, **kwargs):
        COUNTERS["backward_calls"] += 1  # a compiled step tells a training step by it
        _take()  # none can be left from an earlier backward; drop any, to be safe
        try:
            return run(*args, **kwargs)
        except BaseException:
            kept = _take()
            if kept is None:
                raise
            raise kept from None

    run_backward._torchspmd = True
    torch.autograd.graph._engine_run_backward = run_backward
    torch.autograd._engine_run_backward = run_backward
