"""How XLA's numbers for a program become a predicted time: an explicit machine model.

A program's time on one device is modelled as

    flops / flops_per_s  +  bytes accessed / bytes_per_s
    + sum over its collectives of (latency_s + group * rendezvous_s
                                   + bytes sent / link_bytes_per_s)

with ``flops`` and ``bytes accessed`` from ``compiled.cost_analysis()`` (per device: the
partitioned program) and the collectives read from the optimized HLO
(:mod:`torchspmd.auto_shard.collectives`; ``group``: the devices taking part in each). A
step adds ``step_overhead_s`` once (launching a compiled step and reading its loss, the
same for every plan).

The constants are the machine's, and there are two ways to get them:

- :func:`fit`: least squares over measured steps of a few plans of real models, each
  with XLA's numbers for its whole step (``python benchmarks/auto_shard.py --fit``
  measures the hand-written plans of five models and prints the fitted machine).
  ``CPU`` was made this way on the development machine, where the 8 XLA CPU devices are
  threads sharing 2 cores: a collective's cost grows with the threads that must meet
  (``rendezvous_s``), and replicated work is paid for once per device.
- :func:`calibrate`: microbenchmarks (a matmul, an elementwise op, an all-reduce at two
  sizes, each run in a loop so that the launch cancels out). A starting point on a new
  machine: real steps run many small kernels and reach lower rates than these loops.

``H100`` is a place for GPU numbers (spec-sheet values; fit or calibrate them on the GPU
before trusting a plan's predicted milliseconds there).

Example::

    >>> CPU.time(flops=2e6, bytes_accessed=0.0, collectives=[]) > 0
    True
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Sequence

from torchspmd.auto_shard.collectives import Collective

__all__ = ["Machine", "CPU", "H100", "calibrate", "fit", "machine_for"]


@dataclasses.dataclass(frozen=True)
class Machine:
    """Per-device rates of one machine kind; see the module docstring for the formula."""

    name: str
    flops_per_s: float
    bytes_per_s: float
    latency_s: float
    link_bytes_per_s: float
    step_overhead_s: float = 0.0
    rendezvous_s: float = 0.0  # per device taking part in a collective

    def time(self, flops: float, bytes_accessed: float,
             collectives: Iterable[Collective]) -> float:
        """Predicted seconds of one program on one device.

        Example::

            >>> CPU.time(0.0, 0.0, []) == 0.0
            True
        """
        return (flops / self.flops_per_s + bytes_accessed / self.bytes_per_s
                + sum(self.latency_s + c.group * self.rendezvous_s
                      + c.sent_bytes / self.link_bytes_per_s for c in collectives))


# Fitted on the development machine (2 cores, 8 XLA CPU devices; quiet) by
# ``python benchmarks/auto_shard.py --fit``, 2026-11-28: 20 measured steps (4 hand-written
# plans of 5 models, stepped in turn), all fitted within 30% (worst 1.24x); leaving one
# model out of the fit, its plans came within 1.33x. The link rate is fixed, not fitted
# (an in-process copy; fitting it too overfits these few rows).
CPU = Machine("cpu", flops_per_s=1.86e10, bytes_per_s=3.58e9, latency_s=0.0,
              link_bytes_per_s=8e9, step_overhead_s=4.3e-3, rendezvous_s=23.4e-6)
# Spec-sheet numbers (fp32 non-tensor-core FLOP/s, HBM3, NVLink 4 one direction); a place
# for measured ones.
H100 = Machine("h100", flops_per_s=67e12, bytes_per_s=3.35e12, latency_s=10e-6,
               link_bytes_per_s=450e9, step_overhead_s=1e-3)


def machine_for(platform: str) -> Machine:
    """The constants for a JAX platform name (``"cpu"``, ``"gpu"``/``"cuda"``).

    Example::

        >>> machine_for("cpu").name
        'cpu'
    """
    return CPU if platform == "cpu" else H100


def _best_of(fn, *args, repeat: int = 5) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def _per_iteration(body, x, sharding, short: int = 2, long: int = 18) -> float:
    """Seconds one ``body(x)`` adds inside a program: a while loop of it run ``short``
    and ``long`` times. The trip count is data (one program, not unrolled), so the
    launch, a few hundred microseconds on 8 CPU devices, cancels out."""
    import jax

    loop = jax.jit(lambda x, k: jax.lax.fori_loop(0, k, lambda i, x: body(x), x),
                   out_shardings=sharding)
    return max((_best_of(loop, x, long) - _best_of(loop, x, short)) / (long - short), 1e-9)


def calibrate(devices=None, size: int = 256) -> Machine:
    """Measure a :class:`Machine` with microbenchmarks on ``devices`` (default: all).

    Each inside one program, on every device at once as a training step runs: a sharded
    matmul (FLOP/s), an elementwise update of a 4 MiB shard (bytes/s), an all-reduce of
    one element (latency) and of 1 MiB (link bandwidth). No step overhead or rendezvous
    term: see :func:`fit` for constants that predict whole steps. Takes a few seconds.

    Example::

        machine = calibrate()     # doctest: +SKIP
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    rows, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    a = jax.device_put(jnp.ones((n * size, size), jnp.float32) / size, rows)
    b = jax.device_put(jnp.ones((size, size), jnp.float32), whole)
    flops_per_s = 2 * size ** 3 / _per_iteration(lambda a: a @ b, a, rows)
    big = jax.device_put(jnp.ones((n * 1024, 1024), jnp.float32), rows)
    bytes_per_s = 2 * 4 * 1024 * 1024 / _per_iteration(lambda x: x * 0.5 + 1.0, big, rows)

    def all_reduce(elements: int) -> float:
        x = jax.device_put(jnp.ones((n, elements), jnp.float32), rows)
        mean = jax.shard_map(lambda x: jax.lax.psum(x, "d") * (1.0 / n), mesh=mesh,
                             in_specs=P("d"), out_specs=P("d"))
        return _per_iteration(mean, x, rows)

    small, large = all_reduce(1), all_reduce(1 << 18)
    sent = 2 * (n - 1) / n * 4 * (1 << 18)
    link = sent / max(large - small, 1e-9)
    return Machine(f"{devices[0].platform} (calibrated)", flops_per_s, bytes_per_s,
                   latency_s=small, link_bytes_per_s=link)


def fit(measured: Sequence[tuple], link_bytes_per_s: float = 8e9,
        name: str = "fitted") -> Machine:
    """The :class:`Machine` whose predictions come nearest measured steps.

    ``measured``: ``(priced, seconds)`` pairs, ``priced`` a plan's
    :class:`~torchspmd.auto_shard.pricing.Priced` (``planner.pricer.price(batch,
    specs)``: XLA's numbers for its whole step) and ``seconds`` its measured step.
    Non-negative least squares over the step overhead, seconds per flop, per byte, per
    collective and per device taking part in one; the link rate is given, not fitted
    (few rows cannot tell it from the rest). Use plans that differ: a few hand-written
    strategies of one or two models.

    Example::

        machine = fit([(planner.pricer.price(b, specs), 0.012), ...])   # doctest: +SKIP
        plan = auto_shard(model, mesh, inputs, machine=machine)
    """
    import numpy as np
    from scipy.optimize import nnls

    if len(measured) < 5:
        raise ValueError(f"torchspmd.auto_shard.fit: {len(measured)} measured steps fit 5 "
                         "constants poorly; measure at least 5 plans (the hand-written "
                         "strategies of two models, say)")
    rows, target = [], []
    for priced, seconds in measured:
        whole = priced.whole
        rows.append([1.0, whole.flops, whole.bytes_accessed + priced.update_bytes,
                     len(whole.collectives), sum(c.group for c in whole.collectives)])
        target.append(seconds - sum(c.sent_bytes for c in whole.collectives) / link_bytes_per_s)
    a, b = np.array(rows), np.array(target)
    scale = np.maximum(a.max(axis=0), 1e-30)  # columns of comparable size for the solver
    x, _ = nnls(a / scale, b)
    overhead, per_flop, per_byte, latency, rendezvous = (x / scale).tolist()
    return Machine(name, flops_per_s=1 / max(per_flop, 1e-30),
                   bytes_per_s=1 / max(per_byte, 1e-30), latency_s=latency,
                   link_bytes_per_s=link_bytes_per_s, step_overhead_s=overhead,
                   rendezvous_s=rendezvous)
