"""Training-step time of torchspmd next to the same model and optimizer written in JAX.

Both sides train ``TinyTransformer`` (``torchspmd.testing.models``) from the same initial
weights on the same batches with AdamW (weight decay 0.1) and the same decaying learning
rate. The JAX side (``benchmarks/jax_transformer.py``) is one ``jax.jit``-ed step with
donated parameters and optimizer state: what XLA does with this model when nothing stands
in front of it. torchspmd's step time is tracing the step + ``torchspmd.sync()`` + waiting
for the result; the JAX step time is the jitted call + waiting for its result. Both read
the loss back to the host every step.

    python benchmarks/train_step.py [--steps 50] [--warmup 5] [--batch 8] [--seq 64]
        [--dim 128] [--layers 2] [--heads 4] [--vocab 256] [--profile N]
        [--mesh AxB --strategy {dp,fsdp,tp,fsdp+tp}]

Prints the median step time of each side, their ratio (target <= 1.2 on one device),
tracing time per step, compiles after warm-up (must be 0), peak host memory, and the
first losses side by side (must agree within 1e-4 relative). Exits non-zero when the
losses disagree or torchspmd compiles after warm-up. ``--profile N`` adds torchspmd's N
heaviest functions per timed step (cProfile, compiles excluded).

``--mesh AxB`` runs both sides on A*B CPU devices (``TORCHSPMD_CPU_DEVICES``), on a
``('data', 'model')`` mesh. ``--strategy`` (default ``fsdp+tp``) picks the parameter
layouts of ``examples/gpt.py``'s ``param_spec``, adapted to TinyTransformer's names:
``dp`` replicates; ``tp`` splits ``qkv``/``up`` column-wise (output features) and
``proj``/``down`` row-wise (input features) over ``'model'``; ``fsdp`` splits each
parameter's largest dim over both axes; ``fsdp+tp`` does the Megatron split, then the
largest free dim over ``'data'``. The batch goes over ``'data'`` (``tp``, ``fsdp+tp``) or
over both axes (``dp``, ``fsdp``), as ``gpt.batch_spec``. torchspmd marks its parameters
and batch with ``mark_sharding``; JAX gets the very same ``NamedSharding`` per
state_dict name (parameters, both AdamW moments and the batch) and its jit propagates
from there. The report adds the collectives of torchspmd's step graph (and of JAX's).
"""

from __future__ import annotations

import os
import sys

# "On one device": torchspmd gives JAX this many CPU devices, and unsharded data is
# replicated over all of them, so with the default of 8 every op would run 8 times.
# Must be set before torchspmd (or jax) is imported. With --mesh AxB (read here, before
# argparse runs) it is A*B devices instead.


def _mesh_from_argv(argv) -> tuple[int, int] | None:
    """``(A, B)`` of ``--mesh AxB`` / ``--mesh=AxB`` in ``argv``, else None."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--mesh" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--mesh="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                a, b = (int(s) for s in value.lower().split("x"))
            except ValueError:
                return None  # argparse reports it
            return a, b
    return None


_EARLY_MESH = _mesh_from_argv(sys.argv[1:]) if __name__ == "__main__" else None
if _EARLY_MESH is not None:
    os.environ["TORCHSPMD_CPU_DEVICES"] = str(_EARLY_MESH[0] * _EARLY_MESH[1])
else:
    os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402

import torchspmd  # noqa: E402
from torchspmd.debug.hlo import collectives  # noqa: E402
from torchspmd.testing.models import batches  # noqa: E402

# The JAX model is this script's sibling; benchmarks/ is no package (python -m cProfile
# puts the script's folder on the path too, but an import of this module would not).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layouts import STRATEGIES, Layout  # noqa: E402
from step_trainers import (build_model, compiled_trainer, jax_collectives,  # noqa: E402
                           jax_compiled, jax_trainer, peak_bytes, run_interleaved,
                           torchspmd_trainer)

LOSS_RTOL = 1e-4
LOSSES_COMPARED = 5



def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps first (AdamW's first steps compile new graphs)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="cProfile torchspmd's timed steps and print its own N "
                             "heaviest functions per step (times are then inflated)")
    parser.add_argument("--mesh", default=None, metavar="AxB",
                        help="shard over A ('data') x B ('model') CPU devices")
    parser.add_argument("--strategy", default="fsdp+tp", choices=STRATEGIES,
                        help="parameter layouts with --mesh (as examples/gpt.py)")
    args = parser.parse_args(argv)
    args.mesh_shape = None
    if args.mesh is not None:
        shape = _mesh_from_argv(["--mesh", args.mesh])
        if shape is None or min(shape) < 1:
            parser.error(f"--mesh {args.mesh}: expected AxB, e.g. 4x2")
        if shape[0] * shape[1] != jax.device_count():
            parser.error(f"--mesh {args.mesh} needs {shape[0] * shape[1]} devices, JAX has "
                         f"{jax.device_count()} (TORCHSPMD_CPU_DEVICES is read at import: "
                         f"run the script, not main(), with --mesh)")
        args.mesh_shape = shape
    return args


# --- profile ----------------------------------------------------------------------

def profiled(step, warmup: int, profiler: cProfile.Profile):
    """``step`` with ``profiler`` on during the timed steps only (compiles excluded)."""

    def run(i, x, y):
        if i < warmup:
            return step(i, x, y)
        profiler.enable()
        try:
            return step(i, x, y)
        finally:
            profiler.disable()

    return run


def print_profile(profiler: cProfile.Profile, steps: int, top: int) -> None:
    """torchspmd's own functions by cumulative time per step: where the core spends it."""
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, ncalls, tt, ct, callers)
    package = os.path.dirname(os.path.abspath(torchspmd.__file__))
    rows = [(ct, tt, n, f"{os.path.relpath(file, os.path.dirname(package))}:{name}")
            for (file, _, name), (_, n, tt, ct, _) in stats.items()
            if os.path.abspath(file).startswith(package)]
    print(f"torchspmd profile, per step ({steps} steps; cumulative includes callees):")
    print(f"  {'cum ms':>8} {'own ms':>8} {'calls':>7}  function")
    for ct, tt, n, where in sorted(rows, reverse=True)[:top]:
        print(f"  {ct / steps * 1e3:8.2f} {tt / steps * 1e3:8.2f} {n / steps:7.0f}  {where}")


# --- timing and report ---------------------------------------------------------------

def peak_rss_mib() -> float:
    # ru_maxrss is in KiB on Linux; it is the peak of the whole process (both sides).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_losses(name: str, spmd: list[float], ref: list[float]) -> bool:
    print(f"first losses   {name:>12} {'JAX':>12} {'rel diff':>10}")
    ok = True
    for i, (a, b) in enumerate(zip(spmd[:LOSSES_COMPARED], ref[:LOSSES_COMPARED])):
        rel = abs(a - b) / abs(b)
        ok &= rel <= LOSS_RTOL
        print(f"  step {i:<7} {a:12.6f} {b:12.6f} {rel:10.2e}")
    print(f"loss check ({name}): {'PASS' if ok else 'FAIL'} (rtol {LOSS_RTOL:g})")
    return ok


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def report(results: dict, spmd_step, compiled_step, jax_step, steps: int) -> bool:
    med = {k: statistics.median(results[k]["times"]) for k in ("torchspmd", "compiled", "jax")}
    # The fastest step too: on a shared machine it is the least disturbed one.
    fast = {k: min(results[k]["times"]) for k in med}
    counters = results["counters"]
    user, launch, wait = (statistics.median(p[k] for p in spmd_step.phases[-steps:])
                          for k in range(3))
    host = {"torchspmd": statistics.median(p[0] + p[1] for p in spmd_step.phases[-steps:]),
            "compiled": statistics.median(p[0] for p in compiled_step.phases[-steps:]),
            "jax": statistics.median(jax_step.host[-steps:])}
    compiles = counters["graphs_compiled"]
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}")
    if results.get("layout") is not None:
        layout = results["layout"]
        print(f"mesh {dict(layout.mesh.shape())}, strategy {layout.strategy}, "
              f"batch spec {layout.batch}")
    print(f"{'':18}{'step ms':>9} {'fastest':>9} {'host ms':>9} {'step/JAX':>9} {'host/JAX':>9}")
    for name, label in (("torchspmd", "lazy"), ("compiled", "torchspmd.compile"), ("jax", "JAX")):
        print(f"{label:18}{med[name] * 1e3:9.2f} {fast[name] * 1e3:9.2f} "
              f"{host[name] * 1e3:9.2f} {med[name] / med['jax']:9.2f} "
              f"{host[name] / host['jax']:9.2f}")
    print(f"(median of {steps} steps; host ms: from the step's start until the call returns "
          "with the device still working: trace + sync() for lazy)")
    print(f"ratio torchspmd / JAX: {med['torchspmd'] / med['jax']:.2f}  (lazy path)")
    print(f"ratio compiled / JAX: {med['compiled'] / med['jax']:.2f}  (target <= 1.05 on one "
          f"device); host {host['compiled'] / host['jax']:.2f} (target <= 1.5 on fsdp+tp)")
    print(f"  lazy tracing (trace_time_s): {counters['trace_time_s'] / steps * 1e3:8.2f} ms/step "
          f"(both torchspmd sides), {counters['ops_traced'] / steps:.0f} ops/step")
    print(f"  lazy user code, opt.step():  {user * 1e3:8.2f} ms/step (median; opt.step() "
          "launches the program)")
    print(f"  lazy sync() after it (host): {launch * 1e3:8.2f} ms/step (median)")
    print(f"  lazy wait + .item():         {wait * 1e3:8.2f} ms/step (median)")
    host_cpu = statistics.median(p[3] for p in spmd_step.phases[-steps:])
    print(f"  lazy host CPU time:          {host_cpu * 1e3:8.2f} ms/step (median; user code "
          "and sync() as CPU time: less disturbed by other load)")
    cpu_c = statistics.median(p[2] for p in compiled_step.phases[-steps:])
    cpu_j = statistics.median(jax_step.host_cpu[-steps:])
    print(f"  host thread CPU until the call returns: compiled {cpu_c * 1e3:.2f} ms, JAX "
          f"{cpu_j * 1e3:.2f} ms ({cpu_c / cpu_j:.2f}x; the host's own work, without the "
          "waits for cores the running program takes)")
    print(f"  compile time after warm-up: {counters['compile_time_s']:.3f} s")
    peak_c = peak_bytes(compiled_step.compiled.memory_analysis())
    peak_j = peak_bytes(jax_compiled(jax_step).memory_analysis())
    ratio = f" ({peak_c / peak_j:.2f}x JAX)" if peak_c and peak_j else ""
    print(f"peak device memory per device (XLA memory analysis): compiled {_mib(peak_c)}, "
          f"JAX {_mib(peak_j)}{ratio}")
    print(f"compiles after warm-up: torchspmd {compiles:.0f} (must be 0), "
          f"JAX jit cache size {results['jax_cache_size']}")
    print(f"compiled step after warm-up: {counters['step_replays']:.0f} replays, "
          f"{counters['step_captures']:.0f} captures (must be 0), "
          f"{counters['donated_bytes'] / 2**20 / steps:.1f} MiB donated per step")
    print(f"peak host memory (ru_maxrss, whole process): {peak_rss_mib():.0f} MiB "
          f"({results['rss_before_mib']:.0f} MiB before the first step)")
    if results.get("layout") is not None:
        print(f"collectives per step: torchspmd {_counts(results['spmd_collectives'])}; "
              f"JAX {_counts(results['jax_collectives'])}")
    ok = check_losses("torchspmd", results["torchspmd"]["losses"], results["jax"]["losses"])
    ok &= check_losses("compiled", results["compiled"]["losses"], results["jax"]["losses"])
    return ok and compiles == 0 and counters["step_captures"] == 0


def main(argv=None) -> int:
    args = parse_args(argv)
    # XLA's CPU threads and torch's intra-op threads fight over a small host's cores.
    torch.set_num_threads(1)
    total = args.warmup + args.steps
    model = build_model(args)
    data = batches(args.vocab, args.seq, args.batch, steps=total)
    layout = Layout(args.mesh_shape, args.strategy) if args.mesh_shape else None
    spmd_step = torchspmd_trainer(model, total, layout)
    compiled_step = compiled_trainer(model, total, layout)
    jax_step = jax_trainer(model, total, args.heads, layout)
    print(f"TinyTransformer vocab={args.vocab} dim={args.dim} layers={args.layers} "
          f"heads={args.heads} seq={args.seq} batch={args.batch}; "
          f"{args.warmup} warm-up + {args.steps} timed steps")
    rss_before = peak_rss_mib()  # imports, both models and the data, nothing run yet
    profiler = cProfile.Profile() if args.profile else None
    traced = profiled(spmd_step, args.warmup, profiler) if profiler else spmd_step
    results = run_interleaved({"torchspmd": traced, "compiled": compiled_step,
                               "jax": jax_step}, data, args.warmup, args.steps)
    results["jax_cache_size"] = jax_step.jitted._cache_size()
    results["rss_before_mib"] = rss_before
    results["layout"] = layout
    if layout is not None:
        results["spmd_collectives"] = collectives(spmd_step.program.optimized_hlo())
        results["jax_collectives"] = jax_collectives(jax_step)
    ok = report(results, spmd_step, compiled_step, jax_step, args.steps)
    if profiler:
        print_profile(profiler, args.steps, args.profile)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
