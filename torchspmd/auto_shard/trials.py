"""The finalist plans timed: each one's compiled whole step run on zeros, in turn.

A prediction ranks plans only to within its error (on the development CPU machine, plans
that split the batch over every device measure 10-25% slower than predicted and plans
that split weights 10-15% faster: ``docs/guides/auto-shard.md``). When the best few are
that close, running them decides. Each finalist's compiled forward and backward (the
program its price was read from, ``WholeStep.program``) is called on zero-filled
arguments laid out as it expects (values do not change how long XLA's kernels take), the
plans one after another in rounds so that a change of the machine's load falls on all of
them alike, and the median of the timed rounds is its time. Nothing of the user's model
runs or changes; one plan's arguments live at a time.

Several processes must call the same programs the same number of times (each call is
one collective program) and must choose the same plan: with more than one process the
rounds are fixed, not cut short by ``budget_s``, and every process takes process 0's
times.

Example::

    seconds = time_programs([whole_dp.program, whole_tp.program])   # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["time_programs"]


def _zeros(program) -> tuple:
    """Zero-filled arguments of a ``jax.stages.Compiled``, each on its input sharding."""
    infos, tree = jax.tree.flatten(program.args_info)
    shardings = jax.tree.leaves(program.input_shardings)
    arrays = [jnp.zeros(info.shape, info.dtype, device=sharding)
              for info, sharding in zip(infos, shardings)]
    args, kwargs = jax.tree.unflatten(tree, arrays)
    return jax.block_until_ready((args, kwargs))


def _seconds(program) -> float:
    args, kwargs = _zeros(program)
    start = time.perf_counter()
    jax.block_until_ready(program(*args, **kwargs))
    return time.perf_counter() - start


def time_programs(programs: Sequence, rounds: int = 15, budget_s: float = 5.0) -> list[float]:
    """Median seconds per call of each ``jax.stages.Compiled`` in ``programs``.

    One untimed round (XLA's first call of a program allocates and warms up), then up to
    ``rounds`` timed rounds, at least two, fewer when the timed rounds have taken
    ``budget_s`` seconds (one process only; see the module docstring).

    Example::

        >>> import jax, jax.numpy as jnp
        >>> f = jax.jit(lambda x: x @ x).lower(jnp.ones((64, 64))).compile()
        >>> [s > 0 for s in time_programs([f], rounds=2)]
        [True]
    """
    for program in programs:  # warm-up
        _seconds(program)
    times: list[list[float]] = [[] for _ in programs]
    start = time.perf_counter()
    for k in range(rounds):
        if k >= 2 and jax.process_count() == 1 and time.perf_counter() - start > budget_s:
            break
        for program, found in zip(programs, times):
            found.append(_seconds(program))
    medians = np.array([statistics.median(found) for found in times])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        medians = np.asarray(multihost_utils.broadcast_one_to_all(medians))
    return [float(s) for s in medians]
