"""Run one fuzz program on CPU eager and on the spmd device, and say how the two compare.

A program is the source of ``def program(dev, xs): ...`` returning its tensors by name.
On CPU, ``xs`` is :class:`CpuCalls` (sharding calls do nothing); on the device it is
:class:`SpmdCalls`, which also checks each annotation's text against the oracle. Example::

    >>> outcome = run_source(source, mixes_device_sets=False)
    >>> outcome.kind
    'ok'
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.api import CheckpointException

import torchspmd
from torchspmd.runtime.placement import MeshMismatchError
from torchspmd.sharding import XLAShardedTensor, get_sharding
from torchspmd.testing.fuzz import oracle
from torchspmd.testing.fuzz.calls import (CpuCalls, SpmdCalls, WrongOutcome, WrongSharding,
                                          data, raised_in_jax)

OK, WRONG, INTERNAL, USER, INVALID = "ok", "wrong value", "internal error", "user error", "invalid program"
ABORT = "process abort"  # the process died (an XLA CHECK failure): see fuzz/parallel.py

# Errors a correct torchspmd may raise for a valid program (each with its sub-kind).
_EXPECTED_MESSAGES = {
    "Existing annotation must be cleared first": "existing annotation",
    "is not supported on the spmd device": "unsupported op",
    # docs/concepts/rules.md "Writes through views": PyTorch's rule, though some CPU kernels skip the check.
    "more than one element of the written-to tensor": "overlapping write",
    # docs/concepts/rules.md "Writes through views": an in-place op reading memory it
    # writes through another view; CPU raises it too, except where its check cannot tell.
    "the written-to tensor refer to a single memory location": "overlapping read",
}


@dataclass
class Outcome:
    """How a program's spmd run compared with CPU: ``kind`` is one of ok / wrong value /
    internal error / user error / invalid program; ``detail`` says what, for a person."""

    kind: str
    detail: str = ""
    subkind: str = ""


def compile_program(source: str):
    """The ``program`` function defined by ``source``."""
    namespace = {"torch": torch, "data": data}
    exec(compile(source, "<fuzz program>", "exec"), namespace)
    return namespace["program"]


def _cause(e: BaseException) -> BaseException:
    """The error itself, out of ``torch.distributed.checkpoint``'s wrapper: DCP catches what
    a planner raises and raises a ``CheckpointException`` (a ``BaseException``) holding it."""
    failures = getattr(e, "failures", None)
    if isinstance(e, CheckpointException) and failures:
        return next(iter(failures.values()))[0]
    return e


def classify(e: BaseException, mixes_device_sets: bool) -> Outcome:
    """Whether an exception of the spmd run is an error a user may get, or a bug."""
    e = _cause(e)
    text = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
    if isinstance(e, WrongSharding):
        return Outcome(WRONG, str(e), "sharding text")
    if isinstance(e, WrongOutcome):
        return Outcome(WRONG, str(e), "outcome")
    if isinstance(e, MeshMismatchError):
        # Meshes over one device set must mix freely (docs/concepts/rules.md "Device order").
        return Outcome(USER, text, "mesh mismatch") if mixes_device_sets else Outcome(INTERNAL, text)
    if isinstance(e, torch.OutOfMemoryError):
        # Programs keep every tensor small: the only step that cannot fit is the one
        # ``xs.out_of_memory()`` makes and catches. One reaching the end has spread.
        return Outcome(INTERNAL, text, "failure spread")
    if isinstance(e, (AssertionError, KeyError, IndexError, AttributeError)) or raised_in_jax(e):
        return Outcome(INTERNAL, text)
    for message, subkind in _EXPECTED_MESSAGES.items():
        if message in str(e):
            return Outcome(USER, text, subkind)
    return Outcome(INTERNAL, text)


def run(program, mixes_device_sets: bool) -> Outcome:
    """Replay ``program`` on CPU eager and on the spmd device, and compare every tensor.

    Values are compared with CPU's; a sharded tensor's ``local_shards`` must reassemble
    to CPU's value.
    """
    try:
        expected = program("cpu", CpuCalls)
    except Exception as e:  # the generator wrote a program CPU rejects
        return Outcome(INVALID, f"CPU raises {type(e).__name__}: {e}")
    try:
        got = program(torchspmd.device(), SpmdCalls)
        for name, want in expected.items():
            problem = oracle.compare(name, got[name].cpu(), want)
            if problem is None and get_sharding(got[name]) not in ("", "{replicated}"):
                shards = XLAShardedTensor(got[name]).local_shards
                problem = oracle.check_shards(name + ".local_shards", shards, want)
            if problem is not None:
                return Outcome(WRONG, problem, "local_shards" if "local_shards" in problem else "value")
    except (Exception, CheckpointException) as e:
        outcome = classify(e, mixes_device_sets)
        if outcome.kind == INTERNAL:
            outcome.detail += "\n" + "".join(traceback.format_exception(e)[-6:])
        return outcome
    return Outcome(OK)


def run_source(source: str, mixes_device_sets: bool) -> Outcome:
    """:func:`run` on the program that ``source`` defines."""
    return run(compile_program(source), mixes_device_sets)


def replay(program, mixes_device_sets: bool = False) -> None:
    """Entry point of a repro script: run ``program``, print the outcome, exit 1 on a bug."""
    outcome = run(program, mixes_device_sets)
    print(f"{outcome.kind}{' (' + outcome.subkind + ')' if outcome.subkind else ''}: {outcome.detail}")
    if outcome.kind in (WRONG, INTERNAL, INVALID):
        sys.exit(1)
