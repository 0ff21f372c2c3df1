"""Train a small GPT on the spmd device with sharded parameters and sharded batches.

    python examples/train_gpt.py [--mesh 4x2] [--strategy fsdp+tp] [--devices 4,5,6,7]
        [--steps 200] [--batch 16] [--seq 64] [--dim 128] [--layers 4] [--heads 4]
        [--lr 3e-3] [--seed 0] [--save DIR] [--resume DIR] [--stop-at STEP]
        [--cpu-reference] [--untied] [--losses FILE] [--autocast bf16]

The mesh has two axes, ``('data', 'model')``. Strategies (see ``gpt.param_spec``):
``dp`` replicates the weights and splits the batch over every device; ``fsdp`` splits
each weight's largest dim over every device; ``tp`` splits qkv/up column-wise and
proj/down row-wise over ``'model'`` (Megatron-LM) and the batch over ``'data'``;
``fsdp+tp`` (default) does both, with the FSDP split over ``'data'``. The shardings are
plain ``mark_sharding`` calls: on the parameters, on each block's output (batch dim, as
FSDPv2 does), and a ``ShardedLoader`` uploads each batch already split. XLA compiles the step once (twice: AdamW's first step creates its
state) and reuses it; at the end the script prints the compiled step's collectives and
the runtime's metrics, and fails if it compiled more than 3 times.

``--save DIR`` writes the model, optimizer, step and RNG state as a sharded
``torch.distributed.checkpoint`` (each process writes the shards it owns);
``--resume DIR`` continues from it, on the same loss curve as an uninterrupted run, on
any mesh and process count (each tensor is loaded straight into its own sharding).
``--stop-at K`` ends this run after step K (keeping the ``--steps`` schedule) so it can
be resumed. ``--cpu-reference`` trains the same model on CPU PyTorch and compares.
``--autocast bf16`` runs the forward and the loss under ``torch.autocast`` in bfloat16
(the CPU reference under CPU autocast), as one trains on a GPU; parameters, gradients
and AdamW's state stay float32.

Several processes (``--mesh`` then spans every process's devices; only process 0
prints)::

    torchrun --nproc-per-node 2 examples/train_gpt.py --mesh 4x2   # 4 CPU devices each
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import rich.console
import rich.table
import torch
from tqdm import tqdm

import torchspmd
import torchspmd.debug
import torchspmd.runtime
from torchspmd.data import ShardedLoader
from torchspmd.sharding import Mesh, ShardingSpec, get_sharding, mark_sharding

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for gpt.py beside this file
from gpt import (AXES, GPT, STRATEGIES, CharTokenizer, GPTConfig, TokenBatches,  # noqa: E402
                 batch_spec, lm_loss, make_corpus, param_spec)
from gpt_checkpoint import checkpoint_config, load_checkpoint, save_checkpoint  # noqa: E402

CORPUS_CHARS = 200_000
MAX_COMPILES = 3


@dataclass
class RunResult:
    """What a run measured; ``main`` returns it (tests read it)."""

    losses: list[float]
    cpu_losses: list[float] | None = None
    compiles: int = 0
    collectives: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    host_times: list[float] = field(default_factory=list)  # until the step's call returned
    tokens_per_step: int = 0
    wall_s: float = 0.0

    @property
    def median_step_s(self) -> float:
        """Median step time after the first two steps (which compile)."""
        steady = self.step_times[2:] or self.step_times
        return statistics.median(steady) if steady else float("nan")

    @property
    def median_host_s(self) -> float:
        """Median host time per step (until the call returns) after the first two steps."""
        steady = self.host_times[2:] or self.host_times
        return statistics.median(steady) if steady else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_s

    @property
    def max_rel_diff(self) -> float:
        """Largest ``|spmd - cpu| / |cpu|`` over the steps (needs ``--cpu-reference``)."""
        return max(abs(a - b) / abs(b) for a, b in zip(self.losses, self.cpu_losses))


# --- configuration ---------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mesh", default=None, help="AxB: 'data' x 'model' (default 4x2, or n/2 x 2)")
    p.add_argument("--strategy", default="fsdp+tp", choices=(*STRATEGIES, "auto"),
                   help="auto: torchspmd.auto_shard picks the layouts")
    p.add_argument("--devices", default=None, help="device ids of a sub-mesh, e.g. 4,5,6,7")
    p.add_argument("--steps", type=int, default=200, help="length of the run (and schedule)")
    p.add_argument("--stop-at", type=int, default=None, help="end after this step (to resume)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--untied", action="store_true", help="a separate output head weight")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, metavar="DIR")
    p.add_argument("--resume", default=None, metavar="DIR")
    p.add_argument("--cpu-reference", action="store_true")
    p.add_argument("--autocast", choices=("bf16",), default=None,
                   help="forward and loss under torch.autocast in bfloat16")
    p.add_argument("--no-compile", action="store_true",
                   help="run the lazy path (trace every step) instead of torchspmd.compile")
    p.add_argument("--losses", default=None, metavar="FILE",
                   help="write the step losses as JSON (process 0)")
    return p.parse_args(argv)


def build_mesh(mesh_arg: str | None, devices_arg: str | None) -> Mesh:
    """The ``('data', 'model')`` mesh over all devices or the ``--devices`` sub-mesh."""
    ids = ([int(d) for d in devices_arg.split(",")] if devices_arg
           else list(range(torchspmd.device_count())))
    if mesh_arg is None:
        shape = (len(ids) // 2, 2) if len(ids) % 2 == 0 else (len(ids), 1)
    else:
        shape = tuple(int(s) for s in mesh_arg.lower().split("x"))
        shape = shape if len(shape) == 2 else (shape[0], 1)
    if shape[0] * shape[1] != len(ids):
        raise SystemExit(f"--mesh {mesh_arg} has {shape[0] * shape[1]} devices but "
                         f"{len(ids)} device ids were given")
    return Mesh(np.array(ids), shape, AXES)


def lr_at(step: int, total: int, base: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of ``base``."""
    warmup = max(1, total // 20)
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: GPT, lr: float) -> torch.optim.AdamW:
    """AdamW; matrices decay, biases, norms and position table do not (GPT-2 practice)."""
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.dim() == 2 and not n.startswith("pos")]
    rest = [p for n, p in params.items() if not (p.dim() == 2 and not n.startswith("pos"))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


# --- placing the model on the mesh -----------------------------------------------------

def shard_model(model: GPT, mesh: Mesh, strategy: str) -> dict[str, tuple]:
    """Move ``model`` to the spmd device and ``mark_sharding`` every parameter."""
    model.to(torchspmd.device())
    model.tie_weights()  # Module.to gives each use of a shared weight its own copy
    specs = {}
    for name, p in model.named_parameters():
        specs[name] = param_spec(name, p, strategy)
        mark_sharding(p, mesh, specs[name])
    return specs


def auto_shard_model(model: GPT, mesh: Mesh, example: tuple) -> tuple[dict[str, tuple], tuple]:
    """``--strategy auto``: plan with ``torchspmd.auto_shard`` on the CPU model, print the
    plan, move the model to the spmd device and apply it; the specs and the batch spec."""
    plan = torchspmd.auto_shard(model, mesh, example,
                                loss_fn=lambda m, x, y: lm_loss(m(x), y))
    if _prints():
        print(plan)
    model.to(torchspmd.device())
    model.tie_weights()  # Module.to gives each use of a shared weight its own copy
    plan.apply(model)
    specs = {name: plan.specs.get(name, (None,) * p.dim()) for name, p in model.named_parameters()}
    return specs, plan.batch_spec(2)


def shard_activations(model: GPT, mesh: Mesh, strategy: str) -> None:
    """Keep each block's output (and the logits) split on the batch dim, as FSDPv2 does.

    Only the weights and the batch are annotated otherwise, and XLA may then carry a
    weight's split into the activations and move them between layouts with all-to-alls
    (fsdp on 4x2, 4 layers: 30 per step). Pinning the residual stream to the batch
    layout leaves only the weight all-gathers and gradient reductions.
    """
    spec = (batch_spec(strategy)[0], None, None)

    def constrain(module, inputs, output):
        mark_sharding(output, mesh, spec)  # in place; returning None keeps the output

    for block in model.blocks:
        block.register_forward_hook(constrain)
    model.register_forward_hook(constrain)


def _to_cpu(tree):
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, tree)


# --- training --------------------------------------------------------------------------

@dataclass
class Setup:
    """The starting point both the spmd run and the CPU reference train from.

    On ``--resume`` the spmd run loads the checkpoint into its sharded model and fills
    in ``model``, ``optimizer_state`` and ``start`` for the CPU reference.
    """

    model: GPT  # on the CPU
    optimizer_state: dict | None
    start: int
    tokens: torch.Tensor


def initial_setup(args: argparse.Namespace) -> Setup:
    """A freshly initialized model (seeded; shaped as ``--resume``'s), and the data."""
    corpus = make_corpus(CORPUS_CHARS, seed=0)
    tok = CharTokenizer(corpus)
    torch.manual_seed(args.seed)
    torchspmd.manual_seed(args.seed)
    if args.resume:
        config = checkpoint_config(args.resume)
    else:
        config = GPTConfig(vocab=tok.vocab_size, seq=args.seq, dim=args.dim,
                           layers=args.layers, heads=args.heads, tied=not args.untied)
    return Setup(GPT(config), None, 0, tok.encode(corpus))


def _batches(args: argparse.Namespace, setup: Setup, stop: int) -> TokenBatches:
    return TokenBatches(setup.tokens, args.batch, setup.model.config.seq, stop,
                        seed=args.seed, start=setup.start)


def train_spmd(args: argparse.Namespace, setup: Setup, mesh: Mesh, stop: int) -> RunResult:
    """Shard a copy of the model over ``mesh`` and train it up to step ``stop``."""
    model = copy.deepcopy(setup.model)
    if args.strategy == "auto":
        specs, batch = auto_shard_model(model, mesh, next(iter(_batches(args, setup, stop))))
    else:
        specs, batch = shard_model(model, mesh, args.strategy), batch_spec(args.strategy)
        shard_activations(model, mesh, args.strategy)
    print_parameter_table(model, specs, mesh, args.strategy)
    opt = make_optimizer(model, args.lr)
    if args.resume:
        setup.start = load_checkpoint(args.resume, model, opt)
        if args.cpu_reference:  # the CPU run starts from the same state
            setup.model.load_state_dict(_to_cpu(model.state_dict()))
            setup.optimizer_state = _to_cpu(opt.state_dict())
    loader = ShardedLoader(_batches(args, setup, stop), torchspmd.device(),
                           input_sharding=ShardingSpec(mesh, batch))
    torchspmd.reset_metrics()
    result = RunResult(losses=[], tokens_per_step=args.batch * model.config.seq)
    bar = tqdm(total=stop, initial=setup.start, unit="step", dynamic_ncols=True,
               disable=not _prints())
    train_step = _train_step(model, opt, "spmd" if args.autocast else None)
    if not args.no_compile:
        train_step = torchspmd.compile(train_step)  # Python runs once; then one call a step
    for step, (x, y) in zip(range(setup.start, stop), loader):
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)  # no recompile, no re-capture
        loss = train_step(x, y)
        torchspmd.sync()  # the lazy path's step runs here; a compiled one is running already
        result.host_times.append(time.perf_counter() - start)
        result.losses.append(loss.item())  # waits for the step to finish
        result.step_times.append(time.perf_counter() - start)
        _update_bar(bar, result)
    bar.close()
    result.metrics = torchspmd.metrics()  # before anything else could compile
    result.compiles = int(result.metrics["graphs_compiled"])
    result.collectives = torchspmd.debug.collectives() if result.losses else {}
    if args.save:
        save_checkpoint(args.save, model, opt, stop)
    return result


def _train_step(model: GPT, opt: torch.optim.Optimizer, autocast: str | None = None):
    """The training step: forward, backward, AdamW update; returns the loss.

    ``autocast``: the device type whose ``torch.autocast`` in bfloat16 runs the forward
    and the loss (None: float32 throughout).
    """

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(autocast or "cpu", dtype=torch.bfloat16, enabled=autocast is not None):
            loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step


def _update_bar(bar: tqdm, result: RunResult) -> None:
    dt = result.step_times[-1]
    bar.set_postfix(loss=f"{result.losses[-1]:.4f}",
                    tok_s=f"{result.tokens_per_step / dt:,.0f}", step_ms=f"{dt * 1e3:.0f}",
                    host_ms=f"{result.host_times[-1] * 1e3:.1f}")
    bar.update(1)


def train_cpu(args: argparse.Namespace, setup: Setup, stop: int) -> list[float]:
    """The same model, data, optimizer and schedule in plain CPU PyTorch."""
    model = copy.deepcopy(setup.model)
    opt = make_optimizer(model, args.lr)
    if setup.optimizer_state is not None:
        opt.load_state_dict(setup.optimizer_state)
    losses = []
    train_step = _train_step(model, opt, "cpu" if args.autocast else None)
    for step, (x, y) in zip(range(setup.start, stop), _batches(args, setup, stop)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        losses.append(train_step(x, y).item())
    return losses


# --- reporting -------------------------------------------------------------------------

def _prints() -> bool:
    """Whether this process reports (process 0; every process computes the same)."""
    return torchspmd.runtime.process_index() == 0


def _console() -> rich.console.Console:
    return rich.console.Console(quiet=not _prints())


def print_parameter_table(model: GPT, specs: dict[str, tuple], mesh: Mesh, strategy: str) -> None:
    """Every parameter's shape, partition spec and resulting sharding text."""
    table = rich.table.Table(title=f"{strategy} on mesh {dict(mesh.shape())}, devices "
                                   f"{mesh.device_ids.tolist()}")
    for column in ("parameter", "shape", "partition spec"):
        table.add_column(column, overflow="fold")
    table.add_column("sharding (get_sharding)", overflow="fold", ratio=1)
    for name, p in model.named_parameters():
        table.add_row(name, str(tuple(p.shape)), str(specs[name]), get_sharding(p))
    _console().print(table)


def _two_column_table(title: str, rows: dict) -> rich.table.Table:
    table = rich.table.Table(title=title)
    table.add_column("name")
    table.add_column("value", justify="right")
    for name, value in rows.items():
        table.add_row(name, f"{value:.3f}" if isinstance(value, float) else str(value))
    return table


def print_report(result: RunResult, start: int) -> None:
    """Collectives of the compiled step, ``torchspmd.metrics()``, loss curves, the verdict."""
    console = _console()
    console.print(_two_column_table("collectives in the compiled training step",
                                    result.collectives))
    console.print(_two_column_table("torchspmd.metrics() after training", result.metrics))
    if result.cpu_losses is not None:
        console.print(f"{'step':>5}  {'spmd loss':>10}  {'cpu loss':>10}")
        for i, (a, b) in enumerate(zip(result.losses, result.cpu_losses)):
            console.print(f"{start + i:>5}  {a:10.6f}  {b:10.6f}")
        console.print(f"largest relative difference: {result.max_rel_diff:.2e}")
    ok = "ok" if result.compiles <= MAX_COMPILES else f"TOO MANY (limit {MAX_COMPILES})"
    console.print(f"compiles: {result.compiles} ({ok}); {result.tokens_per_s:,.0f} tokens/s at "
                  f"the median step ({result.median_step_s * 1e3:.0f} ms, host "
                  f"{result.median_host_s * 1e3:.1f} ms until the call returned); "
                  f"wall {result.wall_s:.1f} s")


def main(argv: list[str] | None = None) -> RunResult:
    """Train as the command line says; returns the losses and measurements."""
    torch.set_num_threads(1)  # XLA's CPU threads and torch's would fight for the cores
    begin = time.perf_counter()
    args = parse_args(argv)
    mesh = build_mesh(args.mesh, args.devices)
    setup = initial_setup(args)
    stop = min(args.stop_at if args.stop_at is not None else args.steps, args.steps)
    result = train_spmd(args, setup, mesh, stop)
    if args.cpu_reference:
        result.cpu_losses = train_cpu(args, setup, stop)
    result.wall_s = time.perf_counter() - begin
    if result.losses:
        print_report(result, setup.start)
    if args.losses and _prints():
        with open(args.losses, "w") as f:
            json.dump({"start": setup.start, "losses": result.losses}, f)
    return result


if __name__ == "__main__":
    sys.exit(0 if main().compiles <= MAX_COMPILES else 1)
