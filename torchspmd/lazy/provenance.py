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
    """Raise :class:`HostReadInStep` naming ``what`` if a step is being recorded."""
    if ACTIVE[0] is not None:
        raise HostReadInStep(
            f"torchspmd.compile: {what} needs a device value on the host inside a compiled "
            "step. A compiled step runs as one program with no Python between its ops, so "
            "it cannot read values while it runs: move this out of the step (return the "
            "tensor from the step and read it after the call), or run the step without "
            "torchspmd.compile.")


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
