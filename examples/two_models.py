"""Train two MLPs at once, each on its own half of the devices, and print their losses
next to CPU's.

    python examples/two_models.py [--steps 10]

Model A trains on devices 0-3 and model B on devices 4-7, each on a (2, 2) sub-mesh with
its parameters FSDP-sharded and its batch split data-parallel. Each model's step is its
own compiled program on its own devices: ``torchspmd.sync()`` after A's step starts A
running on devices 0-3 while Python traces B's step, and B then runs on devices 4-7.
"""

import os

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "8")  # before torchspmd starts JAX

import argparse  # noqa: E402
import copy  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchspmd as xs  # noqa: E402
from torchspmd.parallel.fsdp import fsdp_partition_spec  # noqa: E402
from torchspmd.testing.models import MLP, adamw_reference_losses  # noqa: E402


def batches(seed: int, steps: int, d_in: int, d_out: int, batch: int = 16):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, d_in, generator=g), torch.randn(batch, d_out, generator=g))
            for _ in range(steps)]


def main(argv=None) -> dict:
    """Train both models on their sub-meshes and on CPU; print and return the losses."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    steps = parser.parse_args(argv).steps
    torch.set_num_threads(1)  # XLA's CPU threads and torch's would fight for the cores

    n = len(xs.get_1d_mesh().device_ids)
    half = n // 2
    assert half % 2 == 0, f"needs a multiple of 4 devices, got {n}"
    meshes = {"A": xs.Mesh(np.arange(half), (2, half // 2), ("data", "fsdp")),
              "B": xs.Mesh(np.arange(half, n), (2, half // 2), ("data", "fsdp"))}
    torch.manual_seed(0)
    models = {"A": MLP((16, 64, 64, 4)), "B": MLP((8, 32, 2))}
    data = {"A": batches(1, steps, 16, 4), "B": batches(2, steps, 8, 2)}

    # Each model's parameters live on its own sub-mesh only.
    trainers = {}
    for name, model in models.items():
        m = copy.deepcopy(model).to(xs.device())
        for p in m.parameters():
            xs.mark_sharding(p, meshes[name], fsdp_partition_spec(p, shard_maximal=True))
        trainers[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-2))

    losses = {"A": [], "B": []}
    for step in range(steps):
        step_losses = {}
        for name, (m, opt) in trainers.items():
            x, y = (t.to(xs.device()) for t in data[name][step])
            xs.mark_sharding(x, meshes[name], ("data", None))
            xs.mark_sharding(y, meshes[name], ("data", None))
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            xs.sync()  # starts this model's step on its devices; no waiting here
            step_losses[name] = loss
        for name, loss in step_losses.items():
            losses[name].append(loss.item())

    cpu = {name: adamw_reference_losses(models[name], data[name]) for name in models}
    print(f"model A on devices {meshes['A'].device_ids.tolist()}, "
          f"model B on devices {meshes['B'].device_ids.tolist()}")
    print(f"{'step':>4}  {'A spmd':>9}  {'A cpu':>9}  {'B spmd':>9}  {'B cpu':>9}")
    for step in range(steps):
        print(f"{step:>4}  {losses['A'][step]:9.6f}  {cpu['A'][step]:9.6f}  "
              f"{losses['B'][step]:9.6f}  {cpu['B'][step]:9.6f}")
    worst = max(abs(a - b) / abs(b) for name in models for a, b in zip(losses[name], cpu[name]))
    m = xs.metrics()
    print(f"largest relative difference: {worst:.2e}")
    print(f"graphs compiled: {m['graphs_compiled']}, executions: {m['executions']}")
    return {"losses": losses, "cpu_losses": cpu, "meshes": meshes, "models": trainers}


if __name__ == "__main__":
    main()
