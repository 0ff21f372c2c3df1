"""SPMDSavePlanner / SPMDLoadPlanner in one process: shards written once, loads reshard."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import torchspmd
from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner, prime_optimizer
from torchspmd.sharding import Mesh, XLAShardedTensor, get_sharding, mark_sharding

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))
OTHER = Mesh(np.arange(8)[::-1].copy(), (2, 4), ("data", "model"))  # another shape and order
WIDE = Mesh(np.arange(8), (2, 4), ("data", "model"))
SUB = Mesh([4, 5, 6, 7], (2, 2), ("data", "model"))


def on_device(value: torch.Tensor, mesh: Mesh | None = None, spec=None) -> torch.Tensor:
    t = value.to(torchspmd.device())
    if mesh is not None:
        mark_sharding(t, mesh, spec)
    return t


def save(state: dict, path) -> None:
    dcp.save(state, checkpoint_id=str(path), planner=SPMDSavePlanner())


def load(state: dict, path, **kwargs) -> None:
    dcp.load(state, checkpoint_id=str(path), planner=SPMDLoadPlanner(**kwargs))


def chunks(path, key: str) -> list[tuple[tuple, tuple]]:
    stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata[key]
    return sorted((tuple(c.offsets), tuple(c.sizes)) for c in stored.chunks)


VALUE = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8)


def test_works_in_one_process_without_torch_distributed(tmp_path):
    save({"w": on_device(VALUE, MESH, ("data", "model"))}, tmp_path)
    target = {"w": on_device(torch.zeros(16, 8), MESH, ("data", "model"))}
    load(target, tmp_path)
    assert not dist.is_initialized()
    assert torch.equal(target["w"].cpu(), VALUE)


@pytest.mark.parametrize("mesh, spec", [(MESH, ("model", "data")), (OTHER, ("data", "model")),
                                        (OTHER, (None, "model")), (SUB, ("data", None))],
                         ids=["transposed", "other-mesh", "other-spec", "sub-mesh"])
def test_load_reshards_onto_the_target_layout(tmp_path, mesh, spec):
    save({"w": on_device(VALUE, MESH, ("data", "model"))}, tmp_path)
    target = on_device(torch.zeros(16, 8), mesh, spec)
    before = get_sharding(target)
    load({"w": target}, tmp_path)
    assert torch.equal(target.cpu(), VALUE)
    assert get_sharding(target) == before


def test_each_distinct_shard_is_written_once(tmp_path):
    save({"tiled": on_device(VALUE, MESH, ("data", "model")),
          "partial": on_device(VALUE, MESH, ("data", None)),  # 2 replicas of each row block
          "replicated": on_device(VALUE)}, tmp_path)
    assert chunks(tmp_path, "tiled") == [((r, c), (4, 4)) for r in (0, 4, 8, 12) for c in (0, 4)]
    assert chunks(tmp_path, "partial") == [((r, 0), (4, 8)) for r in (0, 4, 8, 12)]
    assert chunks(tmp_path, "replicated") == [((0, 0), (16, 8))]


def test_uneven_shardings_and_dtypes_round_trip_bit_exactly(tmp_path):
    values = {"uneven": torch.randn(9, 5), "bf16": torch.randn(8, 4).to(torch.bfloat16),
              "int": torch.arange(12, dtype=torch.int64).reshape(3, 4), "scalar": torch.tensor(2.5)}
    specs = {"uneven": ("data", "model"), "bf16": ("data", None), "int": (None, "model"), "scalar": ()}
    save({k: on_device(v, MESH, specs[k]) for k, v in values.items()}, tmp_path)
    target = {k: on_device(torch.zeros_like(v), OTHER, specs[k]) for k, v in values.items()}
    load(target, tmp_path)
    for key, value in values.items():
        assert torch.equal(target[key].cpu(), value), key
    assert get_sharding(target["uneven"]) == get_sharding(on_device(values["uneven"], OTHER, specs["uneven"]))


def test_pending_values_are_saved_after_computing_them(tmp_path):
    w = on_device(VALUE, MESH, ("data", "model"))
    save({"w": w * 2 + 1}, tmp_path)
    target = {"w": on_device(torch.zeros(16, 8))}
    load(target, tmp_path)
    assert torch.equal(target["w"].cpu(), VALUE * 2 + 1)


def test_model_and_adamw_state_round_trip_onto_another_mesh(tmp_path):
    def build(mesh):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model.to(torchspmd.device())
        mark_sharding(model[0].weight, mesh, ("model", "data"))
        mark_sharding(model[2].weight, mesh, (None, "model"))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    model, opt = build(MESH)
    for step in range(2):
        model(on_device(torch.randn(8, 8), MESH, ("data", None))).square().mean().backward()
        opt.step()
        opt.zero_grad()
    save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path)

    other, other_opt = build(WIDE)
    prime_optimizer(other_opt)
    state = {"model": other.state_dict(), "optim": other_opt.state_dict()}
    load(state, tmp_path)
    other.load_state_dict(state["model"])
    other_opt.load_state_dict(state["optim"])
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu()), name
    for p, q in zip(model.parameters(), other.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key].cpu(), other_opt.state[q][key].cpu()), key
    assert get_sharding(other[0].weight) == get_sharding(on_device(torch.zeros(16, 8), WIDE, ("model", "data")))


def test_cpu_tensors_python_values_and_sharded_tensor_wrappers(tmp_path):
    wrapped = XLAShardedTensor(on_device(VALUE, MESH, ("data", "model")))
    save({"cpu": torch.ones(3), "lr": 0.5, "w": wrapped}, tmp_path)
    target = {"cpu": torch.zeros(3), "lr": 0.0, "w": XLAShardedTensor(on_device(torch.zeros(16, 8), SUB, (None, "data")))}
    load(target, tmp_path)
    assert torch.equal(target["cpu"], torch.ones(3)) and target["lr"] == 0.5
    assert torch.equal(target["w"].cpu(), VALUE)


def test_shape_mismatch_and_missing_keys_are_clear_errors(tmp_path):
    save({"w": on_device(VALUE, MESH, ("data", "model"))}, tmp_path)
    with pytest.raises(CheckpointException, match=r"Size mismatch between saved torch.Size\(\[16, 8\]\)"):
        load({"w": on_device(torch.zeros(8, 8))}, tmp_path)
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: v"):
        load({"v": on_device(torch.zeros(2))}, tmp_path)
    untouched = on_device(torch.full((2,), 7.0))
    load({"v": untouched}, tmp_path, allow_partial_load=True)
    assert torch.equal(untouched.cpu(), torch.full((2,), 7.0))


def test_the_default_planners_save_and_load_whole_values_in_one_process(tmp_path):
    """Without the SPMD planners, torch.distributed.checkpoint's defaults treat an spmd
    tensor as one whole value (it asked ``is_pinned()``, which had no implementation)."""
    dcp.save({"w": on_device(VALUE, MESH, ("data", "model"))}, checkpoint_id=str(tmp_path))
    target = {"w": on_device(torch.zeros(16, 8), MESH, ("data", "model"))}
    dcp.load(target, checkpoint_id=str(tmp_path))
    assert torch.equal(target["w"].cpu(), VALUE)
    assert get_sharding(target["w"]) == get_sharding(on_device(VALUE, MESH, ("data", "model")))
