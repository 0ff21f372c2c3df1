"""Training step of a mixture-of-experts decoder: ``torchspmd.compile`` next to pure JAX,
with expert parallelism, on 8 devices.

Both sides train ``TinyMoE`` (``moe_model.py``; its JAX twin is ``jax_moe.py``) from the
same weights on the same batches with AdamW (weight decay 0.1), on a ('data', 'model')
mesh. Layouts, the same NamedSharding per state_dict name on both sides: the experts as
``torchspmd.parallel.shard_experts`` puts them (experts over 'data', each expert's
intermediate dim over 'model', router replicated), attention Megatron-style over 'model'
(``bench_layouts`` 'tp'), the rest replicated, the batch over 'data'. The steps run in
pairs back to back (torchspmd's, then JAX's), so both see the same background load.

    python benchmarks/moe.py [--steps 20] [--warmup 3] [--mesh 4x2] [--batch 8] [--seq 32]
        [--dim 64] [--hidden 128] [--experts 8] [--top-k 2] [--layers 2] [--heads 4]
        [--vocab 256]

Prints the median step time and host time (until the step call returned) of each side and
their ratio (target <= 1.1), the collectives of one MoE layer (forward and backward) and
of the whole step on each side, and the first losses side by side. Exits non-zero when the
losses disagree (rtol 1e-4) or torchspmd compiles after warm-up.
"""

from __future__ import annotations

import os
import sys



def _mesh_from_argv(argv) -> tuple[int, int]:
    """``(A, B)`` of ``--mesh AxB`` in ``argv`` (default 4x2), read before JAX starts."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--mesh" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--mesh=") else None)
        if value is not None:
            a, b = (int(s) for s in value.lower().split("x"))
            return a, b
    return 4, 2


_MESH = _mesh_from_argv(sys.argv[1:])
if __name__ == "__main__":  # JAX gets A*B CPU devices where there is no accelerator
    os.environ["TORCHSPMD_CPU_DEVICES"] = str(_MESH[0] * _MESH[1])

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.debug.hlo import collectives  # noqa: E402
from torchspmd.parallel import shard_experts  # noqa: E402
from torchspmd.sharding.partition_spec import named_sharding  # noqa: E402
from torchspmd.testing.models import batches, lm_loss  # noqa: E402

import jax_moe  # noqa: E402
import jax_transformer as jt  # noqa: E402
from bench_layouts import param_spec  # noqa: E402
from moe_model import TinyMoE  # noqa: E402

WEIGHT_DECAY, LR, LOSS_RTOL = 0.1, 1e-2, 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("steps", 20), ("warmup", 3), ("batch", 8), ("seq", 32), ("dim", 64),
                          ("hidden", 128), ("experts", 8), ("top-k", 2), ("layers", 2),
                          ("heads", 4), ("vocab", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mesh", default="4x2", metavar="AxB", help="'data' x 'model' devices")
    args = parser.parse_args(argv)
    if _MESH[0] * _MESH[1] != jax.device_count():
        parser.error(f"--mesh {args.mesh} needs {_MESH[0] * _MESH[1]} devices, JAX has "
                     f"{jax.device_count()} (run the script, not main())")
    return args


def layouts(model: TinyMoE, mesh) -> dict[str, tuple]:
    """Partition spec per state_dict name: the experts as ``shard_experts`` marks them
    (read from its plan), attention over 'model', everything else replicated."""
    plan = shard_experts(copy.deepcopy(model).to(torchspmd.device()), mesh, "data", "model")
    specs = {p.name: p.spec for p in plan.parameters}
    return {name: specs.get(name, param_spec(name, tuple(t.shape), "tp"))
            for name, t in model.state_dict().items()}


def torchspmd_trainer(model: TinyMoE, mesh, specs: dict):
    model = copy.deepcopy(model).to(torchspmd.device())
    shard_experts(model, mesh, "data", "model")
    for name, p in model.named_parameters():
        if "experts" not in name:
            torchspmd.mark_sharding(p, mesh, specs[name])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    @torchspmd.compile
    def train(x, y):
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss

    def step(x, y):
        start = time.perf_counter()
        x, y = x.to(torchspmd.device()), y.to(torchspmd.device())
        torchspmd.mark_sharding(x, mesh, ("data", None))
        torchspmd.mark_sharding(y, mesh, ("data", None))
        loss = train(x, y)
        step.host.append(time.perf_counter() - start)
        return loss.item()

    step.host, step.compiled = [], train
    return step


def jax_trainer(model: TinyMoE, mesh, specs: dict, heads: int, top_k: int):
    params = {n: jax.device_put(v, named_sharding(mesh, specs[n]))
              for n, v in jt.params_from_torch(model.state_dict()).items()}
    opt = jt.adamw_init(params)
    opt = {"step": jax.device_put(opt["step"], named_sharding(mesh, ())),
           "exp_avg": {n: jax.device_put(v, params[n].sharding) for n, v in opt["exp_avg"].items()},
           "exp_avg_sq": {n: jax.device_put(v, params[n].sharding)
                          for n, v in opt["exp_avg_sq"].items()}}
    state = {"params": params, "opt": opt}
    out = jax.tree.map(lambda a: a.sharding, (params, opt)) + (named_sharding(mesh, ()),)
    train = jax_moe.make_train_step(heads, top_k, WEIGHT_DECAY, out_shardings=out)
    batch = named_sharding(mesh, ("data", None))

    def step(x, y):
        start = time.perf_counter()
        x, y = jax.device_put((x.numpy(), y.numpy()), batch)
        step.args = (state["params"], state["opt"], x, y, jt.as_lr(LR))
        state["params"], state["opt"], loss = train(*step.args)
        step.host.append(time.perf_counter() - start)
        return float(loss)

    step.host, step.jitted = [], train
    return step


def layer_collectives(model: TinyMoE, mesh, specs: dict, args) -> tuple[dict, dict]:
    """Collectives of one MoE layer's forward and backward (loss ``sum(out ** 2)``), the
    input (batch, seq, dim) over 'data': torchspmd's graph and JAX's."""
    layer = copy.deepcopy(model).to(torchspmd.device())
    shard_experts(layer, mesh, "data", "model")
    moe = layer.blocks[0].moe
    x = torch.randn(args.batch, args.seq, args.dim).to(torchspmd.device())
    torchspmd.mark_sharding(x, mesh, ("data", None, None))
    x.requires_grad_()
    (moe(x) ** 2).sum().backward()
    torchspmd.sync()
    ours = collectives()
    prefix = "blocks.0.moe"
    params = {n: v for n, v in jt.params_from_torch(model.state_dict()).items()
              if n.startswith(prefix)}
    shardings = ({n: named_sharding(mesh, specs[n]) for n in params},
                 named_sharding(mesh, ("data", None, None)))

    def loss(p, x):
        return (jax_moe.moe(p, prefix, x, args.top_k) ** 2).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=shardings)
    theirs = collectives(grad.lower(params, jax.numpy.asarray(x.detach().cpu().numpy()))
                         .compile().as_text())
    return ours, theirs


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    mesh = torchspmd.Mesh(range(_MESH[0] * _MESH[1]), _MESH, ("data", "model"))
    torch.manual_seed(0)
    model = TinyMoE(args.vocab, args.dim, args.heads, args.layers, args.seq, args.hidden,
                    args.experts, args.top_k)
    specs = layouts(model, mesh)
    ours = torchspmd_trainer(model, mesh, specs)
    theirs = jax_trainer(model, mesh, specs, args.heads, args.top_k)
    data = batches(args.vocab, args.seq, args.batch, steps=args.warmup + args.steps)
    losses, times = {"torchspmd": [], "jax": []}, {"torchspmd": [], "jax": []}
    before = None
    for i, (x, y) in enumerate(data):
        if i == args.warmup:
            before = torchspmd.metrics()
        for name, step in (("torchspmd", ours), ("jax", theirs)):
            start = time.perf_counter()
            losses[name].append(step(x, y))
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    compiles = torchspmd.metrics()["graphs_compiled"] - before["graphs_compiled"]
    med = {k: statistics.median(v) for k, v in times.items()}
    host = {"torchspmd": statistics.median(ours.host[args.warmup:]),
            "jax": statistics.median(theirs.host[args.warmup:])}
    print(f"TinyMoE vocab={args.vocab} dim={args.dim} hidden={args.hidden} experts="
          f"{args.experts} top-{args.top_k} layers={args.layers} seq={args.seq} batch="
          f"{args.batch}; mesh {dict(mesh.shape())} on {jax.device_count()} x "
          f"{jax.devices()[0].platform}; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"{'':18}{'step ms':>9} {'host ms':>9}")
    for name, label in (("torchspmd", "torchspmd.compile"), ("jax", "JAX")):
        print(f"{label:18}{med[name] * 1e3:9.2f} {host[name] * 1e3:9.2f}")
    print(f"ratio compiled / JAX: {med['torchspmd'] / med['jax']:.2f} (target <= 1.1); "
          f"host {host['torchspmd'] / host['jax']:.2f}")
    step_ours = collectives(ours.compiled.optimized_hlo())
    step_theirs = collectives(theirs.jitted.lower(*theirs.args).compile().as_text())
    layer_ours, layer_theirs = layer_collectives(model, mesh, specs, args)
    print(f"collectives, one MoE layer fwd+bwd: torchspmd {_counts(layer_ours)}; "
          f"JAX {_counts(layer_theirs)}")
    print(f"collectives, whole step: torchspmd {_counts(step_ours)}; JAX {_counts(step_theirs)}")
    print(f"compiles after warm-up: torchspmd {compiles} (must be 0)")
    ok = compiles == 0
    print(f"first losses   {'torchspmd':>12} {'JAX':>12} {'rel diff':>10}")
    for i, (a, b) in enumerate(zip(losses["torchspmd"][:5], losses["jax"][:5])):
        rel = abs(a - b) / abs(b)
        ok &= rel <= LOSS_RTOL
        print(f"  step {i:<7} {a:12.6f} {b:12.6f} {rel:10.2e}")
    print(f"loss check: {'PASS' if ok else 'FAIL'} (rtol {LOSS_RTOL:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
