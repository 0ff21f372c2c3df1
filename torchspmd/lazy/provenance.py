"""Where a recorded step's inputs come from: the storages it touched while it was recorded.

``torchspmd.compile`` records a step once with the ordinary lazy recorder and turns the
recorded graph into a program. For that it must know, for every data leaf the graph
reads, which live tensor storage held it when the step began (a parameter, an optimizer
moment, ``p.grad``...), and which storages the step wrote. The handles report every
storage they read or write here while a :class:`StorageTouches` is being recorded; outside a
recording the hooks cost one list lookup.

Example::

    with recording() as rec:
        p.add_(1)
    rec.initial[p.handle.storage]   # p's value when the step began (a data leaf)
    p.handle.storage in rec.written  # True
"""

from __future__ import annotations

import contextlib
import sys
import weakref

# The active recording, or None (a one-element list so hooks read it without a global).
ACTIVE: list = [None]
# Bumped when a recording starts: views cached before it re-derive from their storage,
# so a read of ``p.grad`` (a view) is traced back to the storage that holds it.
EPOCH: list[int] = [0]


class HostReadInStep(RuntimeError):
    """A value was needed on the host while a compiled step was being recorded."""


class StorageTouches:
    """The storages one recorded step touched.

    ``initial`` maps each storage that existed before the step and was read or written
    to its value when the step began; ``read`` holds those of them the step read before
    writing them (it read that value); ``written`` holds the storages the step assigned;
    ``created`` the storages the step made.
    """

    def __init__(self):
        self.initial: dict = {}
        self.read: dict = {}  # an insertion-ordered set
        self.written: dict = {}  # an insertion-ordered set
        self.created: "weakref.WeakSet" = weakref.WeakSet()
        # (weak reference, version) of each CPU tensor whose data the step took in: a
        # constant of the program, so changing it in place later must capture again.
        self.host_reads: list = []

    def touched(self, storage) -> None:
        if storage not in self.initial and storage not in self.created:
            self.initial[storage] = storage.value


def touched(storage) -> None:
    """Hook: ``storage``'s value is about to be read."""
    rec = ACTIVE[0]
    if rec is not None:
        rec.touched(storage)
        if storage in rec.initial and storage not in rec.written:
            rec.read[storage] = None


def wrote(storage) -> None:
    """Hook: ``storage`` is about to get a new value."""
    rec = ACTIVE[0]
    if rec is not None:
        rec.touched(storage)
        rec.written[storage] = None


def created(storage) -> None:
    """Hook: ``storage`` was just made."""
    rec = ACTIVE[0]
    if rec is not None:
        rec.created.add(storage)


def read_host(tensor) -> None:
    """Hook: a CPU tensor's data is about to become a constant of the graph."""
    rec = ACTIVE[0]
    if rec is not None:
        rec.host_reads.append((weakref.ref(tensor), tensor._version))


def is_recording() -> bool:
    """Whether a compiled step is being recorded now."""
    return ACTIVE[0] is not None


def refuse_host_read(what: str) -> None:
    """Raise :class:`HostReadInStep` naming ``what`` (and the library code that read, if
    any: ``_library_hint``) if a step is being recorded."""
    if ACTIVE[0] is not None:
        raise HostReadInStep(
            f"torchspmd.compile: {what} needs a device value on the host inside a compiled "
            "step. A compiled step runs as one program with no Python between its ops, so "
            "it cannot read values while it runs: move this out of the step (return the "
            "tensor from the step and read it after the call), or run the step without "
            f"torchspmd.compile.{_library_hint(sys._getframe(1))}")


# Library code that reads on the host inside a step, and what to do instead. The
# reads come from inside PyTorch, so the generic advice does not say which call it was.
_LIBRARY_READS = (
    ("torch/amp/grad_scaler.py",
     "GradScaler.step reads whether a gradient was inf or NaN: give it a fused optimizer "
     "(fused=True: Adam, AdamW, SGD, Adagrad), which skips the step on the device, or call "
     "scaler.step and scaler.update after the compiled function."),
    ("torch/optim/_adafactor.py",
     "Adafactor's update reads each parameter's norm on the host: call opt.step() after "
     "the compiled function."),
    ("torch/nn/utils/clip_grad.py",
     "clip_grad_norm_(error_if_nonfinite=True) reads the total norm on the host to raise: "
     "leave error_if_nonfinite False and check the returned norm after the call, or skip "
     "non-finite steps on the device (torch.amp.GradScaler with a fused optimizer)."),
    ("torch/optim/lbfgs.py",
     "LBFGS's line search reads the loss on the host: call opt.step(closure) after the "
     "compiled function."),
    ("torch/optim/swa_utils.py",
     "AveragedModel.update_parameters reads n_averaged on the host (copy on the first call, "
     "average after): call it after the compiled function, or average in the step with "
     "tensor ops (torch._foreach_lerp_(averaged_params, params, 1 - decay))."),
    ("torch/optim/",
     "the optimizer reads a value on the host with these options: foreach=True (or fused=True "
     "where the optimizer has it) keeps its math on the device, or call opt.step() after "
     "the compiled function."),
)


def _library_hint(frame) -> str:
    """`` The read is in <file>:<line> (<function>): <advice>`` for the innermost frame
    of a library in ``_LIBRARY_READS``, else ''."""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        for where, advice in _LIBRARY_READS:
            if where in path:
                at = f"{path.split('site-packages/')[-1]}:{frame.f_lineno}"
                return f" The read is in {at} ({frame.f_code.co_name}): {advice}"
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def recording():
    """Record which storages the code inside touches (see :class:`StorageTouches`)."""
    if ACTIVE[0] is not None:
        raise RuntimeError("torchspmd.compile: a compiled step called another compiled step "
                           "while it was being recorded; call the inner function undecorated")
    rec = StorageTouches()
    EPOCH[0] += 1
    ACTIVE[0] = rec
    try:
        yield rec
    finally:
        ACTIVE[0] = None
