"""Does a sub-mesh cost anything? One MLP training step on 4 of 8 devices vs on all of 4.

The same step (``torchspmd.testing.models.MLP``, AdamW, parameters FSDP-sharded and the
batch data-parallel over a ``(2, 2)`` mesh ``('data', 'fsdp')``) runs twice:

- sub-mesh: in this process, with ``TORCHSPMD_CPU_DEVICES=8``, on ``Mesh([4, 5, 6, 7])``;
- full mesh: in a child process started with ``TORCHSPMD_CPU_DEVICES=4``, on
  ``Mesh([0, 1, 2, 3])``.

A step is tracing + ``torchspmd.sync()`` + waiting + reading the loss. Both processes
stay up and take turns running blocks of steps (``--rounds`` blocks each), so a busy
machine slows both alike.

    python benchmarks/submesh.py [--steps 60] [--warmup 5] [--rounds 6] [--batch 64]
        [--dim 256] [--layers 3]

Prints both median step times and the ratio sub-mesh / full (target <= 1.1), compiles
after warm-up (must be 0) and the first losses of both sides (must agree). Exits
non-zero when the losses disagree or a side compiles after warm-up.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--child" in sys.argv:
    os.environ["TORCHSPMD_CPU_DEVICES"] = "4"  # the full mesh is all of this process's devices
else:
    os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "8")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.jax_setup import devices  # noqa: E402
from torchspmd.sharding import Mesh, mark_sharding  # noqa: E402
from torchspmd.testing.models import MLP  # noqa: E402

SUB_MESH_IDS = [4, 5, 6, 7]
FULL_MESH_IDS = [0, 1, 2, 3]
LOSS_RTOL = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=6,
                        help="alternating blocks the timed steps are split into")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3, help="hidden layers")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _fsdp_spec(p: torch.Tensor) -> tuple:
    largest = list(p.shape).index(max(p.shape))
    return tuple("fsdp" if d == largest else None for d in range(p.dim()))


class Trainer:
    """The MLP training step on ``Mesh(device_ids, (2, 2), ('data', 'fsdp'))``."""

    def __init__(self, args, device_ids: list[int]):
        self.mesh = Mesh(device_ids, (2, 2), ("data", "fsdp"))
        torch.manual_seed(0)
        sizes = (args.dim,) + (args.dim,) * args.layers + (16,)
        self.model = copy.deepcopy(MLP(sizes)).to("spmd")
        for p in self.model.parameters():
            mark_sharding(p, self.mesh, _fsdp_spec(p))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.1)
        g = torch.Generator().manual_seed(1)
        self.data = [(torch.randn(args.batch, args.dim, generator=g),
                      torch.randn(args.batch, 16, generator=g)) for _ in range(4)]
        self.losses: list[float] = []
        for _ in range(args.warmup):
            self.step()
        self.compiled = torchspmd.metrics()["graphs_compiled"]

    def step(self) -> float:
        """One step (trace, sync, wait, read the loss); its wall time in seconds."""
        start = time.perf_counter()
        x, y = (t.to("spmd") for t in self.data[len(self.losses) % len(self.data)])
        mark_sharding(x, self.mesh, ("data", None))
        mark_sharding(y, self.mesh, ("data", None))
        self.opt.zero_grad()
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        torchspmd.sync()
        torchspmd.wait_device_ops()
        self.losses.append(loss.item())
        return time.perf_counter() - start

    def run(self, steps: int) -> dict:
        times = [self.step() for _ in range(steps)]
        return {"times": times, "losses": self.losses[:5],
                "compiles_after_warmup": torchspmd.metrics()["graphs_compiled"] - self.compiled}


def child(args) -> None:
    """The full-mesh side: a block of steps per request line on stdin, JSON back."""
    assert len(devices()) == 4, f"expected 4 devices, got {len(devices())}"
    trainer = Trainer(args, FULL_MESH_IDS)
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        print(json.dumps(trainer.run(int(line))), flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        child(args)
        return 0
    argv = [sys.executable, os.path.abspath(__file__), "--child", f"--warmup={args.warmup}",
            f"--batch={args.batch}", f"--dim={args.dim}", f"--layers={args.layers}"]
    env = dict(os.environ, TORCHSPMD_CPU_DEVICES="4")
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        trainer = Trainer(args, SUB_MESH_IDS)  # warms up while the child does
        assert proc.stdout.readline().strip() == "ready", "the full-mesh process failed"
        block = -(-args.steps // args.rounds)
        sub_times, full_times = [], []
        for _ in range(args.rounds):  # take turns, so a busy machine slows both alike
            sub_run = trainer.run(block)
            sub_times += sub_run["times"]
            proc.stdin.write(f"{block}\n")
            proc.stdin.flush()
            full_run = json.loads(proc.stdout.readline())
            full_times += full_run["times"]
    finally:
        proc.stdin.close()
        proc.wait()
    sub = statistics.median(sub_times)
    full = statistics.median(full_times)
    sizes = f"batch {args.batch}, dim {args.dim}, {args.layers} hidden layers"
    print(f"MLP training step ({sizes}), mesh (2, 2) ('data', 'fsdp'), "
          f"{len(sub_times)} timed steps per side in {args.rounds} alternating blocks")
    print(f"  sub-mesh  {SUB_MESH_IDS} of 8 devices: median {sub * 1e3:8.2f} ms")
    print(f"  full mesh {FULL_MESH_IDS} of 4 devices: median {full * 1e3:8.2f} ms")
    print(f"  ratio sub-mesh / full: {sub / full:.3f} (target <= 1.1)")
    compiles = [sub_run["compiles_after_warmup"], full_run["compiles_after_warmup"]]
    print(f"  compiles after warm-up (sub-mesh, full): {compiles} (must be 0)")
    a, b = sub_run["losses"], full_run["losses"]
    print("  first losses (sub-mesh | full):",
          ", ".join(f"{x:.5f}|{y:.5f}" for x, y in zip(a, b)))
    same = len(a) == len(b) and all(abs(x - y) <= LOSS_RTOL * max(abs(y), 1e-12)
                                    for x, y in zip(a, b))
    if not same:
        print("  LOSSES DISAGREE", file=sys.stderr)
    return 0 if same and not any(compiles) else 1


if __name__ == "__main__":
    sys.exit(main())
