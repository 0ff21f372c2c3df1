"""A PyTorch/XLA SPMD training script (data parallel + tensor parallel), in torch_xla's API.

Run it with `python -m torchspmd.compat tests/compat/scripts/dp_tp.py --steps 8`.
In the style of PyTorch/XLA's SPMD examples and user guide: a 2-D mesh ('data', 'model'),
Megatron column/row shardings with xs.mark_sharding, batches sharded over 'data' by
MpDeviceLoader, the lazy loop ended by xm.mark_step, tensors made on the 'xla' device.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    xr.use_spmd()
    torch.manual_seed(0)
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n // 2, 2), ("data", "model"))
    device = xm.xla_device()
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
    xs.mark_sharding(model[0].weight, mesh, ("model", None))   # column-parallel
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))   # row-parallel
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8 * n, 16)
    y = x[:, :4].sum(dim=1, keepdim=True).repeat(1, 4)
    batches = [(x, y)] * args.steps
    loader = pl.MpDeviceLoader(batches, device, input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    scale = torch.tensor(1.0, device="xla")   # the literal device name
    for step, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = ((model(data) - target) ** 2).mean() * scale
        loss.backward()
        xm.optimizer_step(optimizer)
        xm.mark_step()
        print(f"step {step} loss {loss.item():.6f}")
    print(f"weight sharding {xs.get_sharding(model[0].weight)}")
    print(f"compiles {met.counter_value('UncachedCompile')}")


if __name__ == "__main__":
    main()
