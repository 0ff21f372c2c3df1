"""The finalist plans timed: each one's compiled forward and backward run on zeros, in turn.

A prediction ranks plans only to within its error (on the development CPU machine, plans
that split the batch over every device measure 10-25% slower than predicted and plans
that split weights 10-15% faster: ``docs/guides/auto-shard.md``). When the best few are
that close, running them decides. Each finalist's compiled forward and backward (the
program its price was read from, ``WholeStep.program``) is called on zero-filled
arguments laid out as it expects (values do not change how long XLA's kernels take), the
plans one after another in rounds so that a change of the machine's load falls on all of
them alike, and the median of the rounds is its time. Nothing of the user's model runs
or changes; the arguments are made for each call, so that only one plan's live at a time
(each plan fits the budget, several at once might not).

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


def time_programs(programs: Sequence, rounds: int = 15, budget_s: float = 2.0) -> list[float]:
    """Median seconds per call of each ``jax.stages.Compiled`` in ``programs``.

    Up to ``rounds`` rounds, at least three, fewer once they have taken ``budget_s``
    seconds (one process only; see the module docstring). The first call of a program
    allocates and warms up; the median of three or more leaves it out.

    Example::

        >>> import jax, jax.numpy as jnp
        >>> f = jax.jit(lambda x: x @ x).lower(jnp.ones((64, 64))).compile()
        >>> [s > 0 for s in time_programs([f], rounds=3)]
        [True]
    """
    times: list[list[float]] = [[] for _ in programs]
    start = time.perf_counter()
    for k in range(max(rounds, 3)):
        if k >= 3 and jax.process_count() == 1 and time.perf_counter() - start > budget_s:
            break
        for program, found in zip(programs, times):
            found.append(_seconds(program))
    medians = np.array([statistics.median(found) for found in times])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        medians = np.asarray(multihost_utils.broadcast_one_to_all(medians))
    return [float(s) for s in medians]
