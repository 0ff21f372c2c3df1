"""How XLA's numbers for a program become a predicted time: an explicit machine model.

A program's time on one device is modelled as

    flops / flops_per_s  +  bytes accessed / bytes_per_s
    + sum over its collectives of (latency_s + bytes sent / link_bytes_per_s)

with ``flops`` and ``bytes accessed`` from ``compiled.cost_analysis()`` (per device: the
partitioned program) and the collectives read from the optimized HLO
(:mod:`torchspmd.auto_shard.collectives`). A step adds ``step_overhead_s`` once (the host
work of launching a compiled step, the same for every plan).

The constants are the machine's. ``CPU`` was measured once on the development machine
(8 XLA CPU devices sharing 2 loaded cores, so a "device" gets a fraction of a core:
replicated work is paid for 8 times) with :func:`calibrate`, and written down here.
``H100`` is a place for GPU numbers (spec-sheet values; measure them with
:func:`calibrate` on the GPU before trusting a plan's predicted milliseconds there).

Example::

    >>> CPU.time(flops=2e6, bytes_accessed=0.0, collectives=[]) > 0
    True
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable

from torchspmd.auto_shard.collectives import Collective

__all__ = ["Machine", "CPU", "H100", "calibrate", "machine_for"]


@dataclasses.dataclass(frozen=True)
class Machine:
    """Per-device rates of one machine kind; see the module docstring for the formula."""

    name: str
    flops_per_s: float
    bytes_per_s: float
    latency_s: float
    link_bytes_per_s: float
    step_overhead_s: float = 0.0

    def time(self, flops: float, bytes_accessed: float,
             collectives: Iterable[Collective]) -> float:
        """Predicted seconds of one program on one device.

        Example::

            >>> CPU.time(0.0, 0.0, []) == 0.0
            True
        """
        return (flops / self.flops_per_s + bytes_accessed / self.bytes_per_s
                + sum(self.latency_s + c.sent_bytes / self.link_bytes_per_s
                      for c in collectives))


# Measured with calibrate() on the development machine (2 shared cores, ~8 other jobs,
# 8 XLA CPU devices), 2026-11-27; the step overhead is torchspmd.compile's host time per
# call of a small step there. Noisy: the machine is loaded.
CPU = Machine("cpu", flops_per_s=6e9, bytes_per_s=1.5e9, latency_s=600e-6,
              link_bytes_per_s=2.0e9, step_overhead_s=3e-3)
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
    fn(*args).block_until_ready()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def calibrate(devices=None, size: int = 256) -> Machine:
    """Measure a :class:`Machine` with three small programs on ``devices`` (default: all).

    A sharded matmul (FLOP/s), a sharded elementwise add over a large array (bytes/s) and
    an all-reduce at two sizes (latency and link bandwidth), each on every device at
    once, as a training step runs. Takes a few seconds.

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
    rows = NamedSharding(mesh, P("d"))
    a = jax.device_put(jnp.ones((n * size, size), jnp.float32), rows)
    b = jax.device_put(jnp.ones((size, size), jnp.float32), NamedSharding(mesh, P()))
    matmul = jax.jit(lambda a, b: a @ b, out_shardings=rows)
    flops_per_s = 2 * size ** 3 / _best_of(matmul, a, b)
    big = jax.device_put(jnp.ones((n * 1024, 1024), jnp.float32), rows)
    add = jax.jit(lambda x: x + 1.0, out_shardings=rows)
    bytes_per_s = 2 * 4 * 1024 * 1024 / _best_of(add, big)

    def all_reduce(elements: int) -> float:
        x = jax.device_put(jnp.ones((n, elements), jnp.float32), rows)
        summed = jax.jit(lambda x: jnp.broadcast_to(x.sum(0, keepdims=True), x.shape),
                         out_shardings=rows)
        return _best_of(summed, x)

    small, large = all_reduce(1), all_reduce(1 << 18)
    sent = 2 * (n - 1) / n * 4 * (1 << 18)
    link = sent / max(large - small, 1e-9)
    return Machine(f"{devices[0].platform} (calibrated)", flops_per_s, bytes_per_s,
                   latency_s=small, link_bytes_per_s=link)
