"""Reads of device values by the host: ``to_cpu``, and what an op needs to go on (a
data-dependent size).

Ops like ``nonzero`` or ``x[mask]`` have an output shape that depends on the data. They
run what is pending for the value that decides the size (one host sync), read it, and go
on with static shapes. Inside a captured step (``torchspmd.compile``) such a read cannot
happen, so every one of them goes through :func:`host_read`, which raises
:class:`HostReadError` naming the op while :func:`forbid_host_reads` is active.

Example::

    n = int(host_read(mask.sum(), "nonzero"))        # one host sync
    with forbid_host_reads("torchspmd.compile"):     # what a capture does
        host_read(mask.sum(), "nonzero")              # raises HostReadError
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.node import Node
from torchspmd.lazy.provenance import refuse_host_read
from torchspmd.runtime import execute, transfer
from torchspmd.runtime.read import read

# Why host reads are refused now (innermost last); empty: they are allowed.
_FORBIDDEN: list[str] = []


class HostReadError(RuntimeError):
    """An op needs a device value on the host where no host read may happen."""


@contextlib.contextmanager
def forbid_host_reads(where: str) -> Iterator[None]:
    """Within the block, :func:`host_read` raises; ``where`` names the block in the error.

    Example: ``with forbid_host_reads("torchspmd.compile capture"): step(x)``.
    """
    _FORBIDDEN.append(where)
    try:
        yield
    finally:
        _FORBIDDEN.pop()


_SHAPE = "to decide its output shape"


def check_host_read(op_name: str, purpose: str = _SHAPE) -> None:
    """Raise :class:`HostReadError` if ``op_name`` may not read a value to the host now.

    ``purpose`` says why it reads (for the error), e.g. "to check for a singular input".
    """
    if _FORBIDDEN:
        advice = ("use a static-shape form (e.g. torch.nonzero_static, torch.where(mask, x, "
                  "0) instead of x[mask])" if purpose == _SHAPE else "use a form that does "
                  "not read it (e.g. torch.linalg.inv_ex instead of torch.linalg.inv)")
        raise HostReadError(
            f"torchspmd: {op_name} reads a value from the device {purpose} (a host sync), "
            f"which cannot happen inside {_FORBIDDEN[-1]}. Move {op_name} out of the "
            f"compiled step, or {advice}.")


def host_read(t: SpmdTensor, op_name: str, purpose: str = _SHAPE) -> torch.Tensor:
    """The CPU value of spmd tensor ``t``, read so that ``op_name`` can go on.

    Runs all pending work with ``t`` (one host sync, as any read), so a loop calling such an
    op every iteration starts each iteration from data. ``purpose`` says why (default: to
    size the output). Example: ``count = int(host_read(x.count_nonzero(), "nonzero"))``.
    """
    check_host_read(op_name, purpose)
    return _read_now(t._h.value()).reshape(t.shape)


def to_cpu_value(value: tuple[Node, int]) -> torch.Tensor:
    refuse_host_read("reading a tensor's value (.cpu(), .tolist(), print(t), .to('cpu'))")
    return _read_now(value)


def _read_now(value: tuple[Node, int]) -> torch.Tensor:
    if value[0].host is not None:
        return transfer.to_torch(value[0].host)
    (array,) = read([value])  # runs all pending work: a loop's next iteration starts from data
    execute.release_spent()  # while the devices compute, before waiting for them
    return transfer.to_torch(transfer.download(array))


def to_cpu(t: SpmdTensor) -> torch.Tensor:
    """The CPU value of ``t`` (runs the graph it needs)."""
    return to_cpu_value(t._h.value()).reshape(t.shape)
