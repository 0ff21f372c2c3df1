"""Floors under a training step's host time when PyTorch runs it, next to JAX's, in one run.

Issue 19 asks, at every point of the sweep, for the lazy loop's host time per step to be
<= 2.5x JAX's and the compiled step's <= 1.5x. This measures, at the sweep's one-device
points, what no implementation keeping PyTorch's semantics can go under on this host,
each next to the same model's pure-JAX step (``step_trainers.jax_trainer``) timed in the
same run:

- ``eager``: the same step (modules, autograd, AdamW) in CPU eager PyTorch with 8-wide
  tensors, where the math is nearly free: PyTorch's own per-op work, which every lazy
  tracer runs too.
- ``dispatch``: the same again, every tensor a ``__torch_dispatch__`` subclass whose
  handler only unwraps, runs the op and wraps the result (no recording, no graph, no
  launch): the least a Python tracer adds, since every op enters it through this hook.
- ``state``: right after a compiled step (the program that just ran has evicted the
  host's caches), looking up every state tensor in its slot (parameters, ``p.grad``,
  AdamW's moments and step counter), reading its current device buffer and writing one
  back: what a replay must do at least, since between two calls user code may replace
  or change any of them. Added to the time of the compiled step's own XLA call
  (``metrics()["step_call_s"]``), it is the compiled step's floor.

    python benchmarks/host_floor.py [--steps 20] [--points mlp:128:2,gpt:512:4]

Timings on a shared machine are noisy: quote the load with them.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.testing.models import batches, lm_loss  # noqa: E402

from step_trainers import build_model, compiled_trainer, jax_trainer, lr_at  # noqa: E402

TARGETS = {"lazy": 2.5, "compiled": 1.5}  # host time / JAX's (issue 19)
# The sweep's one-device points (sweep.py's default grid): family, width, depth.
POINTS = "mlp:128:2,mlp:128:24,mlp:512:4,gpt:128:2,gpt:512:4,embed:128:2,embed:512:2"


class Passthrough(torch.Tensor):
    """The cheapest ``__torch_dispatch__`` tensor: unwrap, run the op, wrap the result."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor, requires_grad: bool = False):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device,
            requires_grad=requires_grad)
        wrapper.inner = inner
        return wrapper

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = [a.inner if type(a) is cls else
                [b.inner if type(b) is cls else b for b in a] if type(a) is list else a
                for a in args]
        kwargs = {k: v.inner if type(v) is cls else v for k, v in (kwargs or {}).items()}
        out = func(*args, **kwargs)
        if type(out) is torch.Tensor:
            return cls(out)
        if type(out) in (tuple, list):
            return type(out)(cls(o) if type(o) is torch.Tensor else o for o in out)
        return out


def model_args(family: str, dim: int, depth: int, tiny: bool = False) -> argparse.Namespace:
    """The sweep's model of a point (``tiny``: the same structure, 8 wide, 8 long)."""
    vocab = 32 * dim if family == "embed" else 256
    if tiny:
        return argparse.Namespace(vocab=16, dim=8, heads=2, layers=depth, seq=8,
                                  attention=family != "mlp")
    return argparse.Namespace(vocab=vocab, dim=dim, heads=max(2, dim // 64), layers=depth,
                              seq=64, attention=family != "mlp")


def eager_ms(model: torch.nn.Module, data: list, warmup: int, wrap: bool) -> float:
    """Median ms of the benchmark's step in CPU eager PyTorch (``wrap``: every tensor a
    :class:`Passthrough`)."""
    model = copy.deepcopy(model)
    if wrap:
        for name, p in list(model.named_parameters()):
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr,
                    torch.nn.Parameter(Passthrough(p.detach().clone()), requires_grad=True))
        data = [(Passthrough(x), Passthrough(y)) for x, y in data]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    times = []
    for i, (x, y) in enumerate(data):
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(i, len(data))
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:]) * 1e3


def state_tensors(opt: torch.optim.Optimizer) -> list:
    """Every tensor a compiled AdamW step keeps between calls, looked up in its slot."""
    found = []
    for group in opt.param_groups:
        for p in group["params"]:
            found += [p, p.grad, *(v for v in opt.state[p].values() if isinstance(v, torch.Tensor))]
    return found


def state_ms(opt: torch.optim.Optimizer) -> float:
    """ms to look up every state tensor, read its device buffer and write one back."""
    start = time.perf_counter()
    for t in state_tensors(opt):
        node, index = t.handle.storage.value
        node.arrays[index] = node.arrays[index]
    return (time.perf_counter() - start) * 1e3


def measure(family: str, dim: int, depth: int, steps: int, warmup: int) -> dict:
    total = warmup + steps
    args = model_args(family, dim, depth)
    model = build_model(args)
    data = batches(args.vocab, args.seq, 8, steps=total)
    jax_step = jax_trainer(model, total, args.heads)
    compiled = compiled_trainer(model, total)
    calls, floors = [], []
    for i, (x, y) in enumerate(data):
        jax_step(i, x, y)
        before = torchspmd.metrics()["step_call_s"]
        compiled(i, x, y)
        calls.append(torchspmd.metrics()["step_call_s"] - before)
        floors.append(state_ms(compiled.optimizer))  # the step's program just ran
    tiny = build_model(model_args(family, dim, depth, tiny=True))
    tiny_data = batches(16, 8, 1, steps=total)

    def median(values):
        return statistics.median(values[warmup:]) * 1e3

    return {"point": f"{family} d{dim} L{depth}", "jax": median(jax_step.host),
            "compiled": median([p[0] for p in compiled.phases]), "call": median(calls),
            "state": statistics.median(floors[warmup:]), "states": len(state_tensors(compiled.optimizer)),
            "eager": eager_ms(tiny, tiny_data, warmup, wrap=False),
            "dispatch": eager_ms(tiny, tiny_data, warmup, wrap=True)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--points", default=POINTS, help="family:dim:depth,... (one device)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"host ms per step, medians of {args.steps} steps; ratios to JAX's host time in "
          f"the same run (load average {os.getloadavg()[0]:.1f})")
    print(f"{'point':<16}{'JAX':>7}{'eager':>13}{'dispatch':>14}{'compiled':>14}"
          f"{'XLA call':>10}{'state':>14}{'floor':>13}")
    worst = {"dispatch": 0.0, "floor": 0.0}
    for spec in args.points.split(","):
        family, dim, depth = spec.split(":")
        r = measure(family, int(dim), int(depth), args.steps, args.warmup)
        jax_ms = r["jax"]
        floor = r["call"] + r["state"]
        worst["dispatch"] = max(worst["dispatch"], r["dispatch"] / jax_ms)
        worst["floor"] = max(worst["floor"], floor / jax_ms)

        def cell(ms):
            return f"{ms:6.2f} ({ms / jax_ms:4.1f}x)"
        print(f"{r['point']:<16}{jax_ms:7.2f}{cell(r['eager']):>13}{cell(r['dispatch']):>14}"
              f"{cell(r['compiled']):>14}{r['call']:10.2f}{r['state']:7.2f} ({r['states']:3d})"
              f"{cell(floor):>13}", flush=True)
    print("eager: PyTorch eager with free math; dispatch: the same through a pass-through "
          "__torch_dispatch__ tensor (a Python tracer's least cost; lazy host target "
          f"{TARGETS['lazy']}x); state: reading and writing back every state tensor (their "
          "count) right after a step; floor = the compiled step's XLA call + state "
          f"(compiled host target {TARGETS['compiled']}x)")
    print(f"worst: dispatch {worst['dispatch']:.1f}x JAX's host (lazy target "
          f"{TARGETS['lazy']}x); compiled floor {worst['floor']:.1f}x (target "
          f"{TARGETS['compiled']}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
