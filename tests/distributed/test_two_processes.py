"""Two processes x 4 CPU devices under torchrun give what one process with 8 devices gives.

One launch (``worker.py``) runs every check in both processes and records what each saw;
the tests here compare that with the same program run in this process.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

import torchspmd
from torchspmd.sharding import XLAShardedTensor

from . import programs
from .launcher import torchrun

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def one_process_run() -> tuple[programs.MLP, torch.optim.AdamW, list[float]]:
    """The MLP after 3 steps on 4x2 in this process (8 devices), and its losses."""
    mesh = programs.mesh_4x2()
    model, opt = programs.sharded_mlp(mesh)
    return model, opt, programs.train(model, opt, mesh, range(3))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, one_process_run) -> tuple[list[dict], Path]:
    """What each of the two processes recorded, and where they wrote.

    The launch is shared by the test workers of one session (the first one runs it,
    under a file lock), so that it runs once however pytest-xdist splits this module.
    """
    session = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is inside the session's
        session = session.parent
    shared = session / "two_processes"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "rank1.json").exists():
            checkpoint_in = shared / "one_process_checkpoint"
            programs.save(str(checkpoint_in), *one_process_run[:2])
            finished = torchrun(HERE / "worker.py", str(shared), str(checkpoint_in))
            assert finished.returncode == 0, finished.output[-6000:]
    return [json.loads((shared / f"rank{r}.json").read_text()) for r in (0, 1)], shared


def test_runtime_queries_have_pytorch_xla_spmd_values(ranks):
    for rank, seen in enumerate(ranks[0]):
        assert seen["queries"] == {
            "process_index": rank, "process_count": 2, "global_runtime_device_count": 8,
            "addressable_runtime_device_count": 4, "local_device_count": 2, "world_size": 1,
            "global_ordinal": 0, "local_ordinal": rank, "is_master_ordinal": rank == 0,
            "device_count": 8}


def test_mesh_ids_are_global_and_hybrid_mesh_rows_are_processes(ranks):
    for seen in ranks[0]:
        assert seen["meshes"] == {"1d": list(range(8)), "hybrid": [[0, 1, 2, 3], [4, 5, 6, 7]]}


def test_reading_a_sharded_value_gives_the_one_process_value_everywhere(ranks):
    expected = programs.sharded_value(programs.mesh_4x2())
    for seen in ranks[0]:
        np.testing.assert_allclose(seen["shards"]["cpu"], expected.cpu().numpy(), rtol=1e-6)
        assert seen["shards"]["item"] == pytest.approx(expected.sum().item(), rel=1e-6)
        assert seen["shards"]["sharding"] == torchspmd.get_sharding(expected)


def test_local_shards_list_only_this_process_devices(ranks):
    everything = XLAShardedTensor(programs.sharded_value(programs.mesh_4x2())).local_shards
    for rank, seen in enumerate(ranks[0]):
        mine = everything[4 * rank:4 * rank + 4]
        assert [s[0] for s in seen["shards"]["local_shards"]] == [s.shard_device for s in mine]
        for (_, indices, data), shard in zip(seen["shards"]["local_shards"], mine):
            assert indices == [[i.start, i.stop] for i in shard.indices]
            np.testing.assert_allclose(data, shard.data.numpy(), rtol=1e-6)


def test_host_data_uploads_only_this_process_shards(ranks):
    for seen in ranks[0]:  # (64, 8) float32 is 2048 bytes; 4 of the 8 devices are local
        assert seen["uploads"] == {"sharded": 2048 // 2, "replicated": 2048 * 4}


def test_loader_gives_each_process_its_slice_of_the_global_batch(ranks):
    rows = torch.arange(16, dtype=torch.float32).reshape(8, 2)
    expected = torch.cat([rows, rows + 100])  # process 0's rows, then process 1's
    for rank, seen in enumerate(ranks[0]):
        assert seen["loader"]["shape"] == [16, 2]
        assert seen["loader"]["global"] == expected.tolist()
        assert seen["loader"]["sharding"] == "{devices=[8,1]0,1,2,3,4,5,6,7}"
        assert seen["loader"]["local_rows"] == [8 * rank + 2 * i for i in range(4)]


def test_sub_meshes_inside_one_process_and_across_processes(ranks):
    z = torch.arange(16.).reshape(4, 4)
    for seen in ranks[0]:
        assert seen["sub_meshes"]["inside"] == (z @ z).tolist()
        assert seen["sub_meshes"]["across"] == (torch.arange(8.) * 2 + 1).tolist()
        assert seen["sub_meshes"]["moved"] == torch.arange(8.).tolist()
        assert seen["sub_meshes"]["moved_sharding"] == "{devices=[2,2]4,5,6,7 last_tile_dim_replicate}"


def test_fsdp_tp_training_matches_one_process_within_1e_6(ranks, one_process_run):
    expected = one_process_run[2]
    for seen in ranks[0]:
        np.testing.assert_allclose(seen["checkpoints"]["losses"], expected, rtol=1e-6)


def test_compiled_step_trains_as_in_one_process(ranks):
    mesh = programs.mesh_4x2()
    model, opt = programs.sharded_mlp(mesh)
    expected = programs.train_compiled(model, opt, mesh, range(5))
    for seen in ranks[0]:
        assert seen["compiled"]["replays"] >= 3  # the steps after warm-up and capture
        np.testing.assert_allclose(seen["compiled"]["losses"], expected, rtol=1e-6)
        np.testing.assert_allclose(seen["compiled"]["weight"],
                                   model.layers[0].weight.detach().cpu(), rtol=1e-6, atol=1e-7)


def test_each_process_writes_the_shards_its_devices_own(ranks):
    path = ranks[1] / "checkpoint"
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    weight = metadata.state_dict_metadata["model.layers.0.weight"]  # ("model", "data") on 4x2
    assert sorted(tuple(c.offsets) for c in weight.chunks) == [
        (r, c) for r in (0, 32) for c in (0, 4, 8, 12)]  # every distinct shard once
    files = {(tuple(index.offset), info.relative_path)
             for index, info in metadata.storage_data.items()
             if index.fqn == "model.layers.0.weight"}
    # Devices 0-3 (process 0) own columns 0..7, devices 4-7 (process 1) columns 8..15.
    assert {(offset, name.split("_")[2]) for offset, name in files} == {
        ((r, c), "0" if c < 8 else "1") for r in (0, 32) for c in (0, 4, 8, 12)}


def test_two_process_checkpoint_resumes_in_one_process_on_another_mesh(ranks):
    mesh = programs.mesh_2x4()
    model, opt = programs.sharded_mlp(mesh)
    programs.load(str(ranks[1] / "checkpoint"), model, opt)
    resumed = programs.train(model, opt, mesh, range(3, 6))
    straight_model, straight_opt = programs.sharded_mlp(mesh)
    straight = programs.train(straight_model, straight_opt, mesh, range(6))
    np.testing.assert_allclose(resumed, straight[3:], rtol=1e-6)


def test_one_process_checkpoint_loads_in_two_processes_on_a_sub_mesh(ranks, one_process_run):
    model, opt, _ = one_process_run
    for seen in ranks[0]:
        loaded = seen["checkpoints"]
        for name, value in model.state_dict().items():
            assert loaded["loaded"][name] == value.cpu().tolist(), name
        for moments, p in zip(loaded["loaded_moments"], model.parameters()):
            assert moments == opt.state[p]["exp_avg_sq"].cpu().tolist()
        assert loaded["loaded_sharding"] == "{devices=[2,2]2,4,3,5}"


def test_auto_shard_chooses_one_plan_in_every_process(ranks):
    """Measuring the finalists, the processes run the same programs as many times and
    take process 0's times: every process returns the same plan, times included."""
    first, second = ranks[0]
    assert first["auto_shard"]["measured"]
    assert first["auto_shard"]["plan"] == second["auto_shard"]["plan"]


def test_checkpoint_manager_processes_agree_on_the_write_order(ranks):
    """Every process returns from a save once its write order is on disk, so each finds
    the same latest checkpoint (a rewound save of step 2, then step 4 again)."""
    for seen in ranks[0]:
        assert seen["manager"] == {"steps": [2, 4], "latest": 4, "value": 40.0}
