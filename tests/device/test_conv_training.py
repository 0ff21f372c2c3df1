"""A small convolutional network (strided, grouped, depthwise and transposed convolutions,
batch norm) trains on the device as on CPU: every gradient of the first step and every
parameter after a few steps, with the batch sharded over all devices, in a compiled step."""

import copy

import numpy as np
import torch
from torch import nn

import torchspmd

STEPS = 3  # the first without momentum, then two replays of one step


def tiny_unet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, (3, 2), stride=2, padding=1, groups=2), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise
        nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.Conv2d(4, 2, 1))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 5, 11, generator=g), torch.randn(8, 2, 4, 8, generator=g))
            for _ in range(STEPS)]


def train(model, data, device, compiled=False):
    """SGD with momentum; returns the first step's gradients by name."""
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mesh = torchspmd.Mesh(np.arange(8), (8,), ("data",)) if device != "cpu" else None

    def step(x, y):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    run = torchspmd.compile(step) if compiled else step
    first = {}
    for i, (x, y) in enumerate(data):
        x, y = x.to(device), y.to(device)
        if mesh is not None:
            torchspmd.mark_sharding(x, mesh, ("data", None, None, None))
            torchspmd.mark_sharding(y, mesh, ("data", None, None, None))
        opt.zero_grad()
        run(x, y)
        if i == 0:
            first = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    return model, first


def test_a_conv_net_with_a_sharded_batch_trains_as_on_cpu():
    model, data = tiny_unet(), batches()
    cpu, cpu_grads = train(model, data, "cpu")
    spmd, spmd_grads = train(model, data, torchspmd.device(), compiled=True)
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(spmd_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    for (name, p), q in zip(cpu.state_dict().items(), spmd.state_dict().values()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-4, atol=1e-5, msg=name)
