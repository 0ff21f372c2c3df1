"""``CheckpointManager``: save every N steps, keep the last K, restore the latest.

PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint.CheckpointManager`` API on
``torch.distributed.checkpoint`` with the SPMD planners. Checkpoint ``s`` is the
directory ``path/s``; it counts once DCP wrote its ``.metadata`` (the last file).
With several processes, ``path`` must be storage every process sees (DCP's rule).

"Oldest" and "latest" are in the order checkpoints were written, not by step, as in
PyTorch/XLA: a run rewound to an earlier step that saves it again keeps that
checkpoint and drops the abandoned run's. Each checkpoint records its place in that
order (``.torchspmd_order``), so the order holds across runs.

``save_async`` returns once this process's shards are copied to the host; the files
are written by a background thread while training goes on (so the step after it may
change or donate the device data freely).
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils._pytree import tree_flatten, tree_unflatten

from torchspmd.checkpoint.planners import SPMDLoadPlanner, SPMDSavePlanner
from torchspmd.checkpoint.shards import snapshot
from torchspmd.runtime import processes

__all__ = ["CheckpointManager"]

_METADATA = ".metadata"  # written last by DCP: its presence marks a complete checkpoint
_ORDER = ".torchspmd_order"  # the checkpoint's place in the write order, written after it


class CheckpointManager:
    """Periodic sharded checkpoints under ``path``, one directory per step.

    Args:
      path: the base directory (created if missing).
      save_interval: ``save``/``save_async`` write at steps divisible by it.
      max_to_keep: how many checkpoints to keep (the oldest go first); 0 keeps all.
      max_pending_async: how many ``save_async`` writes may be in flight; one more
        waits for the oldest to finish.

    Example::

        manager = CheckpointManager("ckpt", save_interval=100, max_to_keep=3)
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        start = manager.restore_latest(state) or 0      # in place; None if no checkpoint
        for step in range(start, steps):
            train_step()
            manager.save_async(step + 1, {"model": model.state_dict(),
                                          "optim": optimizer.state_dict()})
        manager.join()
    """

    def __init__(self, path: str | os.PathLike, save_interval: int, max_to_keep: int = 0,
                 max_pending_async: int = 1):
        if save_interval <= 0:
            raise ValueError(f"save_interval must be positive, got {save_interval}")
        if max_to_keep < 0:
            raise ValueError(f"max_to_keep must be non-negative, got {max_to_keep}")
        if max_pending_async <= 0:
            raise ValueError(f"max_pending_async must be positive, got {max_pending_async}")
        processes.init_torch_distributed()
        self.path = os.fspath(path)
        self.save_interval = save_interval
        self.max_to_keep = max_to_keep
        os.makedirs(self.path, exist_ok=True)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchspmd-ckpt")
        self._slots = threading.Semaphore(max_pending_async)
        self._pending: list[tuple[int, Future]] = []
        self._lock = threading.Lock()  # one checkpoint written at a time

    # -- which steps --------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is on the save interval."""
        return step % self.save_interval == 0

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints under ``path``, oldest written first
        (those from before write orders were kept come first, by step)."""
        steps = [int(name) for name in os.listdir(self.path)
                 if name.isdigit() and os.path.exists(os.path.join(self.path, name, _METADATA))]
        return sorted(steps, key=lambda step: (self._order(step), step))

    def latest_step(self) -> int | None:
        """The step of the checkpoint written last, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _order(self, step: int) -> int:
        try:
            with open(os.path.join(self._dir(step), _ORDER)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return -1

    def _record_order(self, step: int) -> None:
        """Give checkpoint ``step`` the next place in the write order (atomically: a
        reader never sees a half-written number)."""
        others = [self._order(s) for s in self.all_steps() if s != step]
        path = os.path.join(self._dir(step), _ORDER)
        with open(path + ".tmp", "w") as f:
            f.write(str(max(others, default=-1) + 1))
        os.replace(path + ".tmp", path)

    def _dir(self, step: int) -> str:
        return os.path.join(self.path, str(step))

    # -- saving -------------------------------------------------------------------------

    def save(self, step: int, state_dict: dict, force: bool = False) -> bool:
        """Write ``state_dict`` as checkpoint ``step`` now, if ``should_save(step)`` or
        ``force``. Returns whether it saved. Every process must call it alike."""
        if not (force or self.should_save(step)):
            return False
        self._raise_failed()
        self._write(step, state_dict)
        return True

    def save_async(self, step: int, state_dict: dict, force: bool = False) -> bool:
        """Like :meth:`save`, but only the copy to the host happens now; a background
        thread writes the files. Returns whether it saved."""
        if not (force or self.should_save(step)):
            return False
        self._raise_failed()
        host = _host_copy(state_dict)  # before the caller's next step changes anything
        self._slots.acquire()
        future = self._writer.submit(self._write, step, host)
        future.add_done_callback(lambda _: self._slots.release())
        self._pending.append((step, future))
        return True

    def _write(self, step: int, state_dict: dict) -> None:
        with self._lock:
            target = self._dir(step)
            if processes.process_index() == 0 and os.path.exists(target):
                shutil.rmtree(target)  # an older run's checkpoint of this step
            _barrier()
            dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(target),
                     planner=SPMDSavePlanner())
            if processes.process_index() == 0:
                self._record_order(step)
                self._drop_oldest()
            # Every process returns once the order is on disk: each then finds the same
            # latest checkpoint (a restore that picked another would hang DCP's load).
            _barrier()

    def _drop_oldest(self) -> None:
        if self.max_to_keep == 0:
            return
        for step in self.all_steps()[:-self.max_to_keep]:
            shutil.rmtree(self._dir(step), ignore_errors=True)

    def join(self) -> None:
        """Wait for every ``save_async`` write; raises the first one's error, if any."""
        pending, self._pending = self._pending, []
        for step, future in pending:
            _raise_if_failed(step, future)

    def _raise_failed(self) -> None:
        """Raise the error of a finished ``save_async`` write that failed, if any."""
        done = [(step, f) for step, f in self._pending if f.done()]
        self._pending = [(step, f) for step, f in self._pending if not f.done()]
        for step, future in done:
            _raise_if_failed(step, future)

    # -- restoring ----------------------------------------------------------------------

    def restore(self, step: int, state_dict: dict) -> None:
        """Load checkpoint ``step`` into ``state_dict`` in place (each tensor keeps its own
        layout). Call ``model.load_state_dict`` / ``optimizer.load_state_dict`` after it
        for values that are not tensors."""
        self.join()
        if step not in self.all_steps():
            raise ValueError(f"torchspmd: no complete checkpoint for step {step} under "
                             f"{self.path}; there are {self.all_steps()}")
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(self._dir(step)),
                 planner=SPMDLoadPlanner())

    def restore_latest(self, state_dict: dict) -> int | None:
        """Restore the checkpoint written last into ``state_dict``; its step, or ``None``
        if there is none (``state_dict`` is then untouched)."""
        step = self.latest_step()
        if step is not None:
            self.restore(step, state_dict)
        return step


def _raise_if_failed(step: int, future: Future) -> None:
    error = future.exception()  # DCP raises CheckpointException, a BaseException
    if error is not None:
        raise RuntimeError(f"torchspmd: writing checkpoint {step} in the background failed: "
                           f"{error}") from error


def _host_copy(state_dict: dict) -> dict:
    """``state_dict`` with device tensors as host copies of this process's shards, CPU
    tensors cloned and other values copied: nothing the training loop changes later."""
    leaves, spec = tree_flatten(state_dict)
    shards = snapshot(dict(enumerate(leaves)))
    copies = [shards[i] if shards[i] is not leaf else
              leaf.clone() if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf)
              for i, leaf in enumerate(leaves)]
    return tree_unflatten(copies, spec)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
