"""One process of the 2-process checks, launched by torchrun (see test_two_processes.py).

    python -m torch.distributed.run --nproc-per-node 2 worker.py OUT_DIR CHECKPOINT_IN

Runs the checks in the same order in both processes and writes what it saw to
``OUT_DIR/rank<r>.json``; the test compares it with a one-process run. Also saves
``OUT_DIR/checkpoint`` (the MLP after 3 steps) and loads ``CHECKPOINT_IN`` (saved by the
test process in one process).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

import torchspmd
import torchspmd.runtime as xr
import torchspmd.runtime.execute
from torchspmd.data import ShardedLoader
from torchspmd.sharding import (HybridMesh, Mesh, ShardingSpec, XLAShardedTensor, get_1d_mesh,
                                get_sharding, mark_sharding)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import programs  # noqa: E402

torch.set_num_threads(1)


def queries() -> dict:
    return {"process_index": xr.process_index(), "process_count": xr.process_count(),
            "global_runtime_device_count": xr.global_runtime_device_count(),
            "addressable_runtime_device_count": xr.addressable_runtime_device_count(),
            "local_device_count": xr.local_device_count(), "world_size": xr.world_size(),
            "global_ordinal": xr.global_ordinal(), "local_ordinal": xr.local_ordinal(),
            "is_master_ordinal": xr.is_master_ordinal(),
            "device_count": torchspmd.device_count()}


def meshes() -> dict:
    hybrid = HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    return {"1d": get_1d_mesh("x").device_ids.tolist(), "hybrid": hybrid.get_logical_mesh().tolist()}


def shards(mesh: Mesh) -> dict:
    value = programs.sharded_value(mesh)
    wrapped = XLAShardedTensor(value)
    return {"cpu": value.cpu().tolist(), "item": value.sum().item(),
            "sharding": get_sharding(value),
            "local_shards": [[s.shard_device, [[i.start, i.stop] for i in s.indices],
                              s.data.tolist()] for s in wrapped.local_shards]}


def uploads(mesh: Mesh) -> dict:
    """Bytes this process sends to its devices for a (64, 8) float32 host tensor."""
    sent = {}
    for name, spec in (("sharded", ("data", "model")), ("replicated", None)):
        before = torchspmd.metrics()["bytes_to_device"]
        x = torch.ones(64, 8).to(torchspmd.device())
        if spec is not None:
            mark_sharding(x, mesh, spec)
        torchspmd.runtime.execute.materialize([x.handle.value()])
        sent[name] = torchspmd.metrics()["bytes_to_device"] - before
    return sent


def loader(mesh: Mesh) -> dict:
    """Each process's loader yields its own rows; the loop sees the global batch."""
    rank = xr.process_index()
    local = [torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2) + 100 * rank]
    spec = ShardingSpec(mesh, ("data", None), minibatch=True)
    (x,) = list(ShardedLoader(local, torchspmd.device(), input_sharding=spec))
    return {"shape": list(x.shape), "global": x.cpu().tolist(), "sharding": get_sharding(x),
            "local_rows": sorted({i.start for s in XLAShardedTensor(x).local_shards
                                  for i in s.indices[:1]})}


def sub_meshes() -> dict:
    inside = Mesh([4, 5, 6, 7], (2, 2), ("a", "b"))  # process 1's devices only
    across = Mesh([2, 3, 4, 5], (4,), ("a",))  # two devices of each process
    z = torch.arange(16.).reshape(4, 4).to(torchspmd.device())
    mark_sharding(z, inside, ("a", "b"))
    w = torch.arange(8.).to(torchspmd.device())
    mark_sharding(w, across, ("a",))
    inside_result, across_result = (z @ z).cpu().tolist(), (w * 2 + 1).cpu().tolist()
    torchspmd.clear_sharding(w)
    mark_sharding(w, inside, ("a",))  # moved between device sets of different processes
    return {"inside": inside_result, "across": across_result, "moved": w.cpu().tolist(),
            "moved_sharding": get_sharding(w)}


def checkpoints(out: str, checkpoint_in: str) -> dict:
    mesh = programs.mesh_4x2()
    model, opt = programs.sharded_mlp(mesh)
    losses = programs.train(model, opt, mesh, range(3))
    programs.save(os.path.join(out, "checkpoint"), model, opt)
    # Saved by the test in one process on 4x2; loaded here onto a sub-mesh across both.
    sub = Mesh([2, 3, 4, 5], (2, 2), ("data", "model"))
    loaded, loaded_opt = programs.sharded_mlp(sub)
    programs.load(checkpoint_in, loaded, loaded_opt)
    state = {k: v.cpu().tolist() for k, v in loaded.state_dict().items()}
    moments = [loaded_opt.state[p]["exp_avg_sq"].cpu().tolist() for p in loaded.parameters()]
    return {"losses": losses, "loaded": state, "loaded_moments": moments,
            "loaded_sharding": get_sharding(loaded.layers[0].weight)}


def compiled() -> dict:
    """A compiled training step: its losses, and how many calls replayed the program."""
    mesh = programs.mesh_4x2()
    model, opt = programs.sharded_mlp(mesh)
    before = torchspmd.metrics()["step_replays"]
    losses = programs.train_compiled(model, opt, mesh, range(5))
    return {"losses": losses, "replays": torchspmd.metrics()["step_replays"] - before,
            "weight": model.layers[0].weight.cpu().tolist()}


def auto_shard() -> dict:
    """The MLP planned on 4x2, its finalists run: the plan every process chose."""
    torch.manual_seed(0)
    model = programs.MLP(programs.SIZES)
    plan = torchspmd.auto_shard(model, programs.mesh_4x2(), programs.batch(0),
                                loss_fn=programs.mse)
    return {"plan": plan.to_json(), "measured": plan.measured_step_ms is not None}


def manager(out: str, mesh: Mesh) -> dict:
    """CheckpointManager over two processes: saves, a rewound save, an async save, then
    each process's view of the steps and the latest one, restored."""
    from torchspmd.checkpoint import CheckpointManager

    def weight(value: float) -> torch.Tensor:
        t = torch.full((8, 4), value).to(torchspmd.device())
        mark_sharding(t, mesh, ("data", "model"))
        return t

    saves = CheckpointManager(os.path.join(out, "managed"), save_interval=2, max_to_keep=2)
    for step in (2, 4, 6):
        saves.save(step, {"w": weight(float(step))})
    saves.save(2, {"w": weight(20.0)})
    saves.save_async(4, {"w": weight(40.0)})
    saves.join()
    target = weight(0.0)
    latest = saves.restore_latest({"w": target})
    return {"steps": saves.all_steps(), "latest": latest, "value": target.cpu()[0, 0].item()}


def main(out: str, checkpoint_in: str) -> None:
    mesh = programs.mesh_4x2()
    result = {"queries": queries(), "meshes": meshes(), "shards": shards(mesh),
              "uploads": uploads(mesh),
              "loader": loader(Mesh(np.arange(8), (8,), ("data",))),
              "sub_meshes": sub_meshes(), "checkpoints": checkpoints(out, checkpoint_in),
              "compiled": compiled(), "auto_shard": auto_shard(),
              "manager": manager(out, mesh)}
    with open(os.path.join(out, f"rank{xr.process_index()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
