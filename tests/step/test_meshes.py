"""Compiled steps on a sub-mesh and with FSDPv2: same losses as CPU, layouts kept."""

import torch
import torch.nn.functional as F

import torchspmd as xs
from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
from torchspmd.testing.models import adamw_reference_losses
from tests.step.helpers import DEVICE, batches, mlp, on_device


def _cpu_reference(data):
    return adamw_reference_losses(mlp("cpu"), data, lr=0.01)


def _compiled_step(model, mesh, batch_axis: str):
    """An AdamW step that marks its batch over ``batch_axis`` inside the step."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    @xs.compile
    def step(x, y):
        xs.mark_sharding(x, mesh, (batch_axis, None))
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def test_a_step_on_a_sub_mesh_trains_as_on_cpu_and_stays_there():
    mesh = xs.Mesh([6, 7], (2,), ("data",))
    model = mlp(DEVICE)
    for p in model.parameters():
        xs.mark_sharding(p, mesh, (None,) * p.dim())
    step = _compiled_step(model, mesh, "data")
    data = batches(4)
    losses = [step(*on_device(x, y)).item() for x, y in data]
    torch.testing.assert_close(losses, _cpu_reference(data), rtol=1e-5, atol=1e-6)
    assert xs.metrics()["step_replays"] >= 2
    shards = xs.wrap_as_sharded_tensor(model[0].weight).local_shards
    assert [s.shard_device for s in shards] == ["CPU:6", "CPU:7"]


def test_an_fsdpv2_step_trains_as_on_cpu():
    mesh = xs.Mesh(list(range(8)), (8,), ("fsdp",))
    model = FSDPv2(mlp(DEVICE), mesh=mesh)
    step = _compiled_step(model, mesh, "fsdp")
    data = batches(4)
    losses = [step(*on_device(x, y)).item() for x, y in data]
    torch.testing.assert_close(losses, _cpu_reference(data), rtol=1e-5, atol=1e-6)
    compiled = xs.metrics()["graphs_compiled"]
    step(*on_device(*data[0]))
    assert xs.metrics()["graphs_compiled"] == compiled
    assert "devices=[8" in xs.get_sharding(model.module[0].weight)
