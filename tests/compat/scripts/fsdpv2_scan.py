"""A PyTorch/XLA SPMD training script (FSDPv2 + scan_layers), written for torch_xla's API.

Run it with `python -m torchspmd.compat tests/compat/scripts/fsdpv2_scan.py --steps 8`.
It follows PyTorch/XLA's examples/fsdp/train_decoder_only_fsdp_v2.py: global mesh with an
'fsdp' axis, MpDeviceLoader with input_sharding, FSDPv2 with a transformer auto-wrap policy,
torch_xla.compile(full_graph=True), step closures, and the decoder layers run by scan_layers.
"""
import argparse
import functools

import numpy as np
import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.utils.utils as xu
from torch_xla import runtime as xr
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch_xla.experimental.scan_layers import scan_layers
from torch_xla.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2


class Layer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, h):
        return h + self.down(torch.relu(self.up(self.norm(h))))


class Model(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(scan_layers(self.layers, self.embed(tokens)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    xr.use_spmd()
    torch.manual_seed(0)
    torch_xla.manual_seed(0)
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(n)), (n, 1), ("fsdp", "model"))
    xs.set_global_mesh(mesh)
    device = torch_xla.device()
    vocab, batch, seq = 32, 2 * n, 8
    tokens = torch.randint(0, vocab, (batch, seq))
    loader = pl.MpDeviceLoader(xu.SampleGenerator(data=(tokens, tokens), sample_count=args.steps),
                               device, input_sharding=xs.ShardingSpec(mesh, ("fsdp", None)))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Layer})
    model = FSDPv2(Model(vocab, 16, 2).to(device), auto_wrap_policy=policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step_fn(data, target):
        optimizer.zero_grad()
        loss = loss_fn(model(data).view(-1, vocab), target.view(-1))
        loss.backward()
        optimizer.step()
        return loss

    compiled = torch_xla.compile(step_fn, full_graph=True, name="step_fn")
    for step, (data, target) in enumerate(loader):
        loss = compiled(data, target)
        xm.add_step_closure(lambda s, l: print(f"step {s} loss {l.item():.6f}"), args=(step, loss))
    xm.mark_step()
    xm.wait_device_ops()
    xm.master_print(f"compiles {met.counter_value('UncachedCompile')}")


if __name__ == "__main__":
    main()
