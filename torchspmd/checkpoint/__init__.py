"""Sharded checkpoints with ``torch.distributed.checkpoint`` (PyTorch/XLA's names).

Each process writes the shards it owns and reads the chunks its devices need; a
checkpoint saved on one mesh (or process count) loads onto any other. Example::

    import torch.distributed.checkpoint as dcp
    from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner

    dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt", planner=SPMDSavePlanner())
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id="ckpt", planner=SPMDLoadPlanner())   # in place

``CheckpointManager`` saves every N steps, keeps the last K and restores the latest.
"""

from torchspmd.checkpoint.manager import CheckpointManager
from torchspmd.checkpoint.optimizer import prime_optimizer
from torchspmd.checkpoint.planners import SPMDLoadPlanner, SPMDSavePlanner

__all__ = ["SPMDSavePlanner", "SPMDLoadPlanner", "CheckpointManager", "prime_optimizer"]
