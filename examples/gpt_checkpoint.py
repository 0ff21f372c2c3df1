"""Sharded checkpoints of the GPT example: model, optimizer, next step and RNG states.

``torch.distributed.checkpoint`` with torchspmd's planners: each process writes the shards
it owns, and a load puts each tensor straight into the sharding it has now, so a run saved
on one mesh and process count resumes on another.

Example::

    save_checkpoint("ckpt", model, opt, step)
    model = GPT(checkpoint_config("ckpt")); ...
    step = load_checkpoint("ckpt", model, opt)
"""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
import torch.distributed.checkpoint as dcp

from gpt import GPT, GPTConfig
from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner, prime_optimizer


def _checkpoint_state(model: GPT, opt: torch.optim.Optimizer, step: int) -> dict:
    """What a checkpoint holds; DCP saves it, and loads into it in place."""
    return {"config": json.dumps(asdict(model.config)), "step": step,
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "rng": {"cpu": torch.get_rng_state(),
                    "spmd": torch.get_device_module("spmd").get_rng_state()}}


def save_checkpoint(path: str, model: GPT, opt: torch.optim.Optimizer, step: int) -> None:
    """A sharded checkpoint of the model, optimizer, next step and RNG states: each
    process writes the shards it owns (every process calls this)."""
    dcp.save(_checkpoint_state(model, opt, step), checkpoint_id=path, planner=SPMDSavePlanner())


def checkpoint_config(path: str) -> GPTConfig:
    """The model configuration stored in the checkpoint at ``path``."""
    state = {"config": ""}
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner(allow_partial_load=True))
    return GPTConfig(**json.loads(state["config"]))


def load_checkpoint(path: str, model: GPT, opt: torch.optim.Optimizer) -> int:
    """Load the checkpoint at ``path`` into the sharded ``model`` and ``opt`` (each tensor
    keeps its sharding) and restore the RNG states; returns the step to continue from."""
    prime_optimizer(opt)  # AdamW's state exists only after a step; DCP loads in place
    state = _checkpoint_state(model, opt, 0)
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["cpu"])
    torch.get_device_module("spmd").set_rng_state(state["rng"]["spmd"])
    return state["step"]
