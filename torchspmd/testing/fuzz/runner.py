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

import torchspmd
from torchspmd.runtime.placement import MeshMismatchError
from torchspmd.sharding import XLAShardedTensor, get_sharding
from torchspmd.testing.fuzz import oracle

OK, WRONG, INTERNAL, USER, INVALID = "ok", "wrong value", "internal error", "user error", "invalid program"

# Errors a correct torchspmd may raise for a valid program (each with its sub-kind).
_EXPECTED_MESSAGES = {
    "Existing annotation must be cleared first": "existing annotation",
    "is not supported on the spmd device": "unsupported op",
    # docs/concepts/rules.md "Writes through views": PyTorch's rule, though some CPU kernels skip the check.
    "more than one element of the written-to tensor": "overlapping write",
}


@dataclass
class Outcome:
    """How a program's spmd run compared with CPU: ``kind`` is one of ok / wrong value /
    internal error / user error / invalid program; ``detail`` says what, for a person."""

    kind: str
    detail: str = ""
    subkind: str = ""


class WrongSharding(Exception):
    """An annotation's text differs from the oracle's (a wrong value of ``get_sharding``)."""


def data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integer-valued CPU data of ``shape``: exact in every fuzzed dtype.

    >>> data((2, 3), torch.float32, 0).shape
    torch.Size([2, 3])
    """
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


class CpuCalls:
    """The sharding API as a no-op, so a program replays on CPU eager."""

    @staticmethod
    def Mesh(device_ids, mesh_shape, axis_names=None):  # noqa: N802 (torchspmd's name)
        return (tuple(device_ids), tuple(mesh_shape), axis_names)

    @staticmethod
    def mark_sharding(t, mesh, spec):
        return t

    annotate_custom_sharding = mark_sharding

    @staticmethod
    def clear_sharding(t):
        return t

    @staticmethod
    def sync():
        return None


class SpmdCalls:
    """The real sharding API; each annotation's text is checked against the oracle."""

    Mesh = torchspmd.Mesh
    clear_sharding = staticmethod(torchspmd.clear_sharding)
    sync = staticmethod(torchspmd.sync)

    @staticmethod
    def _checked(call, t, mesh, spec):
        result = call(t, mesh, spec)
        want = oracle.expected_sharding_text(mesh.device_ids.tolist(), mesh.mesh_shape,
                                             mesh.axis_names, tuple(spec))
        got = get_sharding(t)
        if got != want:
            raise WrongSharding(f"{call.__name__}(spec={tuple(spec)}) on mesh "
                                f"{mesh.device_ids.tolist()} {mesh.mesh_shape}: get_sharding "
                                f"gives {got!r}, expected {want!r}")
        return result

    @classmethod
    def mark_sharding(cls, t, mesh, spec):
        return cls._checked(torchspmd.mark_sharding, t, mesh, spec)

    @classmethod
    def annotate_custom_sharding(cls, t, mesh, spec):
        return cls._checked(torchspmd.annotate_custom_sharding, t, mesh, spec)


def compile_program(source: str):
    """The ``program`` function defined by ``source``."""
    namespace = {"torch": torch, "data": data}
    exec(compile(source, "<fuzz program>", "exec"), namespace)
    return namespace["program"]


def _raised_in_jax(e: BaseException) -> bool:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and ("/jax/" in frames[-1].filename or "/jaxlib/" in frames[-1].filename)


def classify(e: BaseException, mixes_device_sets: bool) -> Outcome:
    """Whether an exception of the spmd run is an error a user may get, or a bug."""
    text = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
    if isinstance(e, WrongSharding):
        return Outcome(WRONG, str(e), "sharding text")
    if isinstance(e, MeshMismatchError):
        # Meshes over one device set must mix freely (docs/concepts/rules.md "Device order").
        return Outcome(USER, text, "mesh mismatch") if mixes_device_sets else Outcome(INTERNAL, text)
    if isinstance(e, torch.OutOfMemoryError):
        return Outcome(USER, text, "out of memory")
    if isinstance(e, (AssertionError, KeyError, IndexError, AttributeError)) or _raised_in_jax(e):
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
    except Exception as e:
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
