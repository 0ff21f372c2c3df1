"""``torch_xla.distributed.parallel_loader``: batches uploaded already sharded.

``MpDeviceLoader(loader, device, input_sharding=spec)`` is ``torchspmd.data.ShardedLoader``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torchspmd.compat.errors import unsupported
from torchspmd.data import ShardedLoader


class MpDeviceLoader(ShardedLoader):
    """``ShardedLoader(loader, device, input_sharding=...)``; ``loader_prefetch_size`` is its
    ``prefetch``. Device-side prefetch and transfer threads are PyTorch/XLA's C++ runtime's."""

    def __init__(self, loader: Iterable, device: torch.device | str, *,
                 input_sharding: Any = None, loader_prefetch_size: int = 1, **kwargs: Any):
        for name in kwargs:
            if name not in ("device_prefetch_size", "host_to_device_transfer_threads",
                            "batchdim"):
                raise TypeError(f"MpDeviceLoader() got an unexpected keyword argument {name!r}")
            if name == "batchdim" and kwargs[name] != 0:
                unsupported("MpDeviceLoader(batchdim=...)", "give input_sharding a "
                            "ShardingSpec that splits the batch dim")
        super().__init__(loader, device, input_sharding=input_sharding,
                         prefetch=loader_prefetch_size)


class ParallelLoader:
    """``ParallelLoader(loader, [device], input_sharding=...).per_device_loader(device)``."""

    def __init__(self, loader: Iterable, devices: list, **kwargs: Any):
        if len(devices) != 1:
            unsupported(f"ParallelLoader over {len(devices)} devices",
                        "under SPMD there is one virtual device; shard the batch with "
                        "input_sharding")
        self._loader = MpDeviceLoader(loader, devices[0], **kwargs)

    def per_device_loader(self, device: Any) -> MpDeviceLoader:
        return self._loader
