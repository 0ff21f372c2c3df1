"""``torch.distributed.checkpoint`` planners for spmd tensors (PyTorch/XLA's names).

``SPMDSavePlanner``: each process writes the shards it owns, one replica of each
distinct region of every sharded tensor (replicated tensors are written once, by the
process of their lowest-id device); CPU tensors and other values are DCP's as usual.

``SPMDLoadPlanner``: loads in place into the state dict's tensors, each laid out as
the tensor already is: its own mesh, partition spec and process count, whatever they
were at save time. Each process reads only the chunks its own devices need, so no host
ever holds the whole state.

Example::

    import torch.distributed.checkpoint as dcp
    from torchspmd.checkpoint import SPMDSavePlanner, SPMDLoadPlanner

    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.save(state, checkpoint_id=path, planner=SPMDSavePlanner())
    ...
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())  # in place
    model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optim"])

With several processes, ``torch.distributed`` must run (DCP agrees on the plan through
it): constructing a planner starts its gloo group if nothing did.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner,
                                                          DefaultSavePlanner,
                                                          create_default_local_load_plan,
                                                          create_default_local_save_plan)
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadPlan, ReadItem, SavePlan,
                                                  TensorWriteData, WriteItem, WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from torchspmd.checkpoint.shards import HostShards, LoadTarget, snapshot
from torchspmd.runtime import processes
from torchspmd.sharding import device_data

__all__ = ["SPMDSavePlanner", "SPMDLoadPlanner"]


def _join_process_group() -> None:
    """DCP needs torch.distributed when there is more than one process."""
    processes.init_torch_distributed()


def _check_process_group() -> None:
    if processes.process_count() > 1 and not dist.is_initialized():
        raise RuntimeError(
            "torchspmd: checkpointing with several processes needs torch.distributed "
            "(DCP plans through it). Call torchspmd.distributed.init_torch_distributed() "
            "in every process first.")


class SPMDSavePlanner(DefaultSavePlanner):
    """A ``SavePlanner`` that writes spmd tensors as the shards each process owns.

    Takes ``DefaultSavePlanner``'s arguments. The owned shards are copied to the host
    in ``set_up_planner`` (all pending values computed in one graph).

    >>> dcp.save(state_dict, checkpoint_id=path, planner=SPMDSavePlanner())  # doctest: +SKIP
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _join_process_group()

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        _check_process_group()
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self.state_dict = snapshot(self.state_dict)

    def create_local_plan(self) -> SavePlan:
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, HostShards)}
        items = list(create_default_local_save_plan(plain, self.is_coordinator).items)
        for fqn, value in self.state_dict.items():
            if isinstance(value, HostShards):
                items.extend(_write_item(fqn, value, start, piece)
                             for start, piece in value.pieces.items())
        self.plan = SavePlan(items, planner_data=self.mappings if self.flatten_state_dict else None)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        value = self.state_dict.get(index.fqn)
        if isinstance(value, HostShards):
            return value.pieces[index.offset]
        return super().lookup_object(index)


def _write_item(fqn: str, shards: HostShards, start: torch.Size, piece: torch.Tensor) -> WriteItem:
    return WriteItem(
        index=MetadataIndex(fqn, start),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=start, sizes=piece.shape),
            properties=TensorProperties(dtype=shards.dtype),
            size=shards.shape))


class SPMDLoadPlanner(DefaultLoadPlanner):
    """A ``LoadPlanner`` that loads spmd tensors in place, resharding as they are laid out.

    Takes ``DefaultLoadPlanner``'s arguments (``allow_partial_load`` included).

    >>> dcp.load(state_dict, checkpoint_id=path, planner=SPMDLoadPlanner())  # doctest: +SKIP
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _join_process_group()
        self._targets: dict[str, LoadTarget] = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        _check_process_group()
        super().set_up_planner(state_dict, metadata, is_coordinator)
        tensors = {fqn: v for fqn, v in self.state_dict.items() if device_data.is_device_tensor(v)}
        # A pending value's layout is XLA's choice, known once computed (one graph for all).
        device_data.device_arrays(list(tensors.values()))
        self._targets = {fqn: LoadTarget.of(v) for fqn, v in tensors.items()}

    def create_local_plan(self) -> LoadPlan:
        plain = {k: v for k, v in self.state_dict.items() if k not in self._targets}
        strict = not self.allow_partial_load
        items = list(create_default_local_load_plan(plain, self.metadata, strict).items)
        for fqn, target in list(self._targets.items()):
            stored = self.metadata.state_dict_metadata.get(fqn)
            if stored is None:
                if strict:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                del self._targets[fqn]  # partial load: the tensor keeps its value
                continue
            _check_stored(fqn, stored, target.tensor)
            chunks = [ChunkStorageMetadata(offsets=start, sizes=size)
                      for start, size in target.chunks()]
            reads = create_read_items_for_chunk_list(fqn, stored, chunks)
            if sum(math.prod(r.lengths) for r in reads) != target.pending:
                raise ValueError(f"torchspmd: the checkpoint's chunks of {fqn} do not cover "
                                 "the tensor (an incomplete or corrupt checkpoint).")
            items.extend(reads)
        return LoadPlan(items)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        # Tensors with nothing to read here (none of this process's devices hold them,
        # or no elements) still get their new (empty here) data in every process.
        for fqn, target in list(self._targets.items()):
            if target.pending == 0:
                target.finish()
                del self._targets[fqn]
        return super().finish_plan(new_plan)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        target = self._targets.get(index.fqn)
        if target is not None:
            return target.buffers[index.offset]
        return super().lookup_tensor(index)

    def transform_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> torch.Tensor:
        # ``dest_offsets`` are relative to the chunk ``lookup_tensor`` returned.
        return narrow_tensor_by_index(tensor, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        target = self._targets.get(read_item.dest_index.fqn)
        if target is not None and target.received(math.prod(read_item.lengths)):
            target.finish()
            del self._targets[read_item.dest_index.fqn]


def _check_stored(fqn: str, stored, tensor: torch.Tensor) -> None:
    if not isinstance(stored, TensorStorageMetadata):
        raise ValueError(f"torchspmd: the checkpoint holds {fqn} as a Python object, "
                         f"not a tensor; the state dict expects a tensor of shape "
                         f"{tuple(tensor.shape)}.")
    if tuple(stored.size) != tuple(tensor.shape):
        raise ValueError(f"Size mismatch between saved {stored.size} and current: "
                         f"{tensor.size()} for {fqn}")
