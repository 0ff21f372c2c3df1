"""``torch_xla.experimental.distributed_checkpoint``: ``torchspmd.checkpoint``'s planners,
``CheckpointManager`` and ``prime_optimizer`` under PyTorch/XLA's names.

Example::

    from torch_xla.experimental.distributed_checkpoint import CheckpointManager
    manager = CheckpointManager("ckpt", save_interval=100, chkpt_on_preemption=False)
"""

from __future__ import annotations

import os
import warnings

from torchspmd.checkpoint import CheckpointManager as _Manager
from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner, prime_optimizer  # noqa: F401

class CheckpointManager(_Manager):
    """``torchspmd.checkpoint.CheckpointManager`` taking PyTorch/XLA's arguments too.

    ``num_of_threads`` (writer threads) changes nothing written. ``process_group`` must
    be None: torchspmd coordinates over its own group. Checkpoints on preemption are a
    TPU feature of PyTorch/XLA that is not served: with ``chkpt_on_preemption=True``
    (PyTorch/XLA's default) the manager warns once and ``reached_preemption`` is always
    False; pass ``False`` to say you know.

    Example::

        >>> manager = CheckpointManager("ckpt", 100, max_to_keep=3, chkpt_on_preemption=False)
    """

    def __init__(self, path: str | os.PathLike, save_interval: int, max_to_keep: int = 0,
                 max_pending_async: int = 1, num_of_threads: int = 1, process_group=None,
                 chkpt_on_preemption: bool = True):
        if process_group is not None:
            raise NotImplementedError(
                "torchspmd.compat: CheckpointManager(process_group=...) is not supported: "
                "torchspmd coordinates checkpoints over its own process group; leave it None.")
        super().__init__(path, save_interval, max_to_keep=max_to_keep,
                         max_pending_async=max_pending_async)
        self.chkpt_on_preemption = chkpt_on_preemption
        if chkpt_on_preemption:
            warnings.warn("torchspmd.compat: CheckpointManager takes no checkpoint on "
                          "preemption (a TPU feature of PyTorch/XLA): reached_preemption() "
                          "is always False. Pass chkpt_on_preemption=False to silence this.",
                          stacklevel=2)

    def reached_preemption(self, step: int) -> bool:
        """False: no preemption is detected here."""
        return False
