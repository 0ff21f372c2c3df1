"""``optimizer.step()`` over spmd parameters launches the pending work, as ``sync()`` does.

A loop written for an eager device calls neither ``sync()`` nor reads, and each step's
parameters come from the last step's: without a boundary every iteration joined one graph,
compiled at the first read (``device/step_boundary.py``).
"""

import copy

import torch
import torch.nn.functional as F

import torchspmd
from tests.step.helpers import train_step

DEV = torchspmd.device()


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3)).to(device)


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def _train(model, batches, device, running=None):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for x, y in batches:
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        if running is not None:
            running += loss.detach()  # kept on the device, read only at the end
    return model


def test_a_loop_without_sync_runs_one_program_per_step_and_trains_as_on_cpu():
    data = _batches(12)
    cpu_running, running = torch.zeros(()), torch.zeros((), device=DEV)
    cpu = _train(_model("cpu"), data, "cpu", cpu_running)
    before = torchspmd.metrics()
    model = _train(_model(DEV), data, DEV, running)
    after = torchspmd.metrics()
    assert after["executions"] - before["executions"] >= 12  # each step ran as it ended
    # The first step creates AdamW's state and the second reads the running sum of the
    # first: at most three graphs, whatever the number of steps.
    assert after["graphs_compiled"] - before["graphs_compiled"] <= 3
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(running.cpu(), cpu_running)


def test_an_optimizer_of_cpu_parameters_leaves_pending_device_work_pending():
    pending = torch.ones(3, device=DEV) * 2
    before = torchspmd.metrics()["executions"]
    _train(_model("cpu"), _batches(2), "cpu")
    assert torchspmd.metrics()["executions"] == before
    assert pending.tolist() == [2.0] * 3


def test_a_compiled_step_is_still_one_program_per_call():
    model = _model(DEV)
    step = torchspmd.compile(train_step(model, torch.optim.AdamW(model.parameters(), lr=0.01)))
    data = _batches(5)
    for x, y in data[:3]:  # warm-up and capture
        step(x.to(DEV), y.to(DEV))
    before = torchspmd.metrics()
    for x, y in data[3:]:
        step(x.to(DEV), y.to(DEV))
    after = torchspmd.metrics()
    assert after["step_replays"] - before["step_replays"] == 2
    assert after["executions"] - before["executions"] == 2
