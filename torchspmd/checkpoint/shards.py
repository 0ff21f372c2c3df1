"""Tensors as the shards a checkpoint writes and reads.

Saving: :func:`snapshot` copies, for every spmd tensor of a state dict, the shards this
process owns to the host (:class:`HostShards`): one replica of each distinct region,
owned by the lowest-id device holding it, so that across processes every region is
written exactly once. After the copy the training loop may change or donate the device
data; the checkpoint is written from the copy.

Loading: a :class:`LoadTarget` is one spmd tensor to fill: the regions its devices in
this process need under the tensor's own layout, a host buffer for each, and, once the
checkpoint's chunks have filled them, the new device array swapped into the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from torchspmd.runtime import transfer
from torchspmd.runtime.array_regions import Region, assemble, local_regions, owned_shards
from torchspmd.sharding import device_data

__all__ = ["HostShards", "LoadTarget", "snapshot", "offsets", "sizes"]


def offsets(box: Region) -> torch.Size:
    """Where ``box`` starts in the global tensor."""
    return torch.Size(start for start, _ in box)


def sizes(box: Region) -> torch.Size:
    """The extent of ``box`` per dim."""
    return torch.Size(stop - start for start, stop in box)


@dataclass
class HostShards:
    """This process's share of one tensor, on the host: region offsets -> CPU data.

    >>> HostShards(torch.Size([4]), torch.float32, {torch.Size([2]): torch.ones(2)}).numel()
    2
    """

    shape: torch.Size
    dtype: torch.dtype
    pieces: dict[torch.Size, torch.Tensor]

    def numel(self) -> int:
        return sum(p.numel() for p in self.pieces.values())


def snapshot(state_dict: dict) -> dict:
    """``state_dict`` (flat) with every spmd tensor replaced by its :class:`HostShards`.

    Pending values are computed first, all in one graph. Every process must call it
    with the same keys, in the same order.
    """
    keys = [k for k, v in state_dict.items() if device_data.is_device_tensor(v)]
    arrays = device_data.device_arrays([state_dict[k] for k in keys])
    result = dict(state_dict)
    for key, array in zip(keys, arrays):
        tensor = state_dict[key]
        pieces = {offsets(box): transfer.to_torch(transfer.read_local(buffer))
                  for box, buffer in owned_shards(array)}
        result[key] = HostShards(torch.Size(tensor.shape), tensor.dtype, pieces)
    return result


@dataclass
class LoadTarget:
    """One spmd tensor being loaded: host buffers for the regions this process needs."""

    tensor: torch.Tensor
    layout: object  # the jax sharding the loaded data takes (the tensor's own)
    buffers: dict[torch.Size, torch.Tensor] = field(default_factory=dict)
    pending: int = 0  # elements still to be read

    @classmethod
    def of(cls, tensor: torch.Tensor) -> LoadTarget:
        layout = device_data.target_layout(tensor)
        shape = tuple(tensor.shape)
        boxes = local_regions(layout, shape)
        buffers = {offsets(b): torch.empty(sizes(b), dtype=tensor.dtype) for b in boxes}
        return cls(tensor, layout, buffers, sum(math.prod(sizes(b)) for b in boxes))

    def chunks(self) -> list[tuple[torch.Size, torch.Size]]:
        """(offsets, sizes) of each region this process reads."""
        return [(start, buf.shape) for start, buf in self.buffers.items()]

    def received(self, elements: int) -> bool:
        """Count ``elements`` as read; whether the tensor is now complete."""
        self.pending -= elements
        if self.pending < 0:
            raise RuntimeError("torchspmd: a checkpoint chunk was read twice")
        return self.pending == 0

    def finish(self) -> None:
        """Swap the filled buffers into the tensor, as device data laid out as ``layout``."""
        hosts = {start: transfer.to_numpy(buf) for start, buf in self.buffers.items()}
        dtype = transfer.to_numpy(torch.empty(0, dtype=self.tensor.dtype)).dtype
        array = assemble(tuple(self.tensor.shape), self.layout, dtype,
                                  lambda device, box: hosts[offsets(box)])
        device_data.replace_data(self.tensor, array)
        self.buffers.clear()
