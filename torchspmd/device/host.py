"""Reads of device values by the host: ``to_cpu``, and what an op needs to go on (a
data-dependent size).

Ops like ``nonzero`` or ``x[mask]`` have an output shape that depends on the data. They
run what is pending for the value that decides the size (one host sync), read it, and go
on with static shapes. A compiled step (``torchspmd.compile``) cannot read values while
it runs: while one is being recorded, every read here raises
:class:`~torchspmd.lazy.provenance.HostReadInStep` naming the op (the one host-read
guard, ``lazy/provenance.refuse_host_read``).

Example::

    n = int(host_read(mask.sum(), "torch.nonzero"))   # one host sync
    torchspmd.compile(lambda m: host_read(m.sum(), "torch.nonzero"))(mask)
    # HostReadInStep: torchspmd.compile: torch.nonzero (it reads a value ...) needs ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from torchspmd.lazy.node import Node
from torchspmd.lazy.provenance import refuse_host_read
from torchspmd.runtime import execute, in_flight, transfer
from torchspmd.runtime.read import read

if TYPE_CHECKING:  # only named in hints: tensor.py reads values through this module
    from torchspmd.device.tensor import SpmdTensor

_SHAPE = "to decide its output shape"


def host_read(t: SpmdTensor, op_name: str, purpose: str = _SHAPE) -> torch.Tensor:
    """The CPU value of spmd tensor ``t``, read so that ``op_name`` can go on.

    Runs all pending work with ``t`` (one host sync, as any read), so a loop calling such an
    op every iteration starts each iteration from data. ``purpose`` says why (default: to
    size the output), in the error raised inside a compiled step.
    Example: ``count = int(host_read(x.count_nonzero(), "nonzero"))``.
    """
    refuse_host_read(f"{op_name} (it reads a value from the device {purpose})")
    return _read_now(t._h.value()).reshape(t.shape)


def to_cpu_value(value: tuple[Node, int]) -> torch.Tensor:
    refuse_host_read("reading a tensor's value (.cpu(), .tolist(), print(t), .to('cpu'))")
    return _read_now(value)


def _read_now(value: tuple[Node, int]) -> torch.Tensor:
    if value[0].host is not None:
        return transfer.to_torch(value[0].host)
    (array,) = read([value])  # runs all pending work: a loop's next iteration starts from data
    # While the devices compute, before waiting for them; a compiled step's leftovers
    # wait for its next call (``release_spent``).
    in_flight.release_spent(keep_steps=True)
    return transfer.to_torch(transfer.download(array))


def to_cpu(t: SpmdTensor) -> torch.Tensor:
    """The CPU value of ``t`` (runs the graph it needs)."""
    return to_cpu_value(t._h.value()).reshape(t.shape)
