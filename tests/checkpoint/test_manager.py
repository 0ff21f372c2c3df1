"""CheckpointManager: saves on its interval, keeps the last K, restores the latest,
and writes asynchronously from a snapshot taken before training goes on."""

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.checkpoint import CheckpointManager
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def weight(value: float) -> torch.Tensor:
    w = torch.full((8, 4), value).to(torchspmd.device())
    mark_sharding(w, MESH, ("data", "model"))
    return w


def test_saves_at_steps_on_the_interval_and_keeps_the_last_k(tmp_path):
    manager = CheckpointManager(tmp_path, save_interval=2, max_to_keep=2)
    w = weight(0.0)
    saved = [manager.save(step, {"w": w}) for step in range(1, 8)]
    assert saved == [False, True, False, True, False, True, False]
    assert manager.all_steps() == [4, 6]
    assert manager.save(7, {"w": w}, force=True) and manager.all_steps() == [6, 7]


def test_restore_latest_loads_the_newest_checkpoint_in_place(tmp_path):
    manager = CheckpointManager(tmp_path, save_interval=1)
    assert manager.restore_latest({"w": weight(0.0)}) is None
    manager.save(1, {"w": weight(1.0)})
    manager.save(2, {"w": weight(2.0)})
    target = weight(0.0)
    assert manager.restore_latest({"w": target}) == 2
    assert torch.equal(target.cpu(), torch.full((8, 4), 2.0))
    assert get_sharding(target) == get_sharding(weight(0.0))
    with pytest.raises(ValueError, match="no complete checkpoint for step 5"):
        manager.restore(5, {"w": target})


def test_a_rewound_run_keeps_what_it_writes_and_drops_the_abandoned_runs(tmp_path):
    """Oldest and latest are in write order, not by step (PyTorch/XLA's rule): a run that
    went back to step 2 and saves it again keeps it; the oldest written (4) goes. The
    order holds for a new manager over the same path (the next run)."""
    manager = CheckpointManager(tmp_path, save_interval=2, max_to_keep=2)
    for step in (2, 4, 6):
        manager.save(step, {"w": weight(float(step))})
    assert manager.all_steps() == [4, 6]
    manager.save(2, {"w": weight(20.0)})  # rewound: step 2 again, with new values
    assert manager.all_steps() == [6, 2]
    target = weight(0.0)
    assert manager.restore_latest({"w": target}) == 2
    assert torch.equal(target.cpu(), torch.full((8, 4), 20.0))
    again = CheckpointManager(tmp_path, save_interval=2, max_to_keep=2)
    assert again.latest_step() == 2
    again.save(4, {"w": weight(40.0)})
    assert again.all_steps() == [2, 4]


def test_save_async_writes_the_values_of_the_moment_it_was_called(tmp_path):
    manager = CheckpointManager(tmp_path, save_interval=1)
    w, step = weight(1.0), torch.tensor(1.0)
    assert manager.save_async(1, {"w": w, "step": step})
    w.mul_(10)  # the training loop goes on, in place
    step.add_(1)
    torchspmd.sync()
    manager.join()
    target = {"w": weight(0.0), "step": torch.tensor(0.0)}
    manager.restore(1, target)
    assert torch.equal(target["w"].cpu(), torch.full((8, 4), 1.0))
    assert target["step"].item() == 1.0


def test_a_failed_async_save_is_raised_by_join(tmp_path):
    manager = CheckpointManager(tmp_path, save_interval=1)
    manager.save_async(1, {"w": weight(1.0), "bad": lambda: None})  # cannot be pickled
    with pytest.raises(RuntimeError, match="writing checkpoint 1 in the background failed"):
        manager.join()
    assert manager.all_steps() == []


@pytest.mark.parametrize("kwargs, message", [
    ({"save_interval": 0}, "save_interval must be positive"),
    ({"save_interval": 1, "max_to_keep": -1}, "max_to_keep must be non-negative"),
    ({"save_interval": 1, "max_pending_async": 0}, "max_pending_async must be positive"),
])
def test_invalid_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        CheckpointManager(tmp_path, **kwargs)
