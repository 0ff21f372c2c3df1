"""The integer program: one batch layout, one candidate per group, least predicted time
within the memory budget.

Variables: ``x[b]`` (the batch layout ``b`` is chosen) and ``y[g, b, c]`` (group ``g``
takes candidate ``c`` under batch layout ``b``), binary, with ``sum_b x[b] = 1`` and
``sum_c y[g, b, c] = x[b]`` for every group and layout: exactly one candidate per group,
under the chosen layout only, so costs that depend on the pair (batch, candidate) stay
linear. Memory: ``sum base_mem[b] x[b] + sum mem[g,b,c] y[g,b,c] <= budget``.
HiGHS (``scipy.optimize.milp``) solves it; the runner-up is the best solution that differs
from the winner (a no-good cut).

Example::

    >>> options = {"b": Option(0.0, 0.0, [[Choice("r", 2.0, 10.0), Choice("s", 3.0, 4.0)]])}
    >>> [s.choices for s in solve(options, budget=5.0, solutions=1)]
    [('s',)]
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Choice", "Option", "Solution", "solve", "smallest_memory"]


@dataclasses.dataclass(frozen=True)
class Choice:
    """A candidate of one group under one batch layout: its name, seconds and bytes."""

    name: str
    time: float
    memory: float


@dataclasses.dataclass(frozen=True)
class Option:
    """One batch layout: its own time and memory and, per group, the valid choices."""

    time: float
    memory: float
    groups: list[list[Choice]]


@dataclasses.dataclass(frozen=True)
class Solution:
    """The chosen batch layout, one choice name per group, predicted seconds and bytes."""

    batch: str
    choices: tuple[str, ...]
    time: float
    memory: float


def smallest_memory(options: dict[str, Option]) -> float:
    """The least predicted memory of any plan (what the tightest budget must allow)."""
    return min(o.memory + sum(min(c.memory for c in g) for g in o.groups)
               for o in options.values())


def solve(options: dict[str, Option], budget: float | None, solutions: int = 2,
          excluded: tuple[Solution, ...] = (), minimize: str = "time") -> list[Solution]:
    """Up to ``solutions`` best plans (least ``minimize``: ``time`` or ``memory``), best
    first, none of them one of ``excluded``; empty when none fits ``budget``."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # slow import: only to plan

    columns: list[tuple[str, int | None, int | None]] = []  # (batch, group, choice)
    for b, option in options.items():
        columns.append((b, None, None))
        columns += [(b, g, i) for g, choices in enumerate(option.groups)
                    for i in range(len(choices))]
    index = {c: k for k, c in enumerate(columns)}
    n = len(columns)

    def cost(column, what):
        b, g, i = column
        option = options[b]
        return getattr(option if g is None else option.groups[g][i], what)

    # Scale to milliseconds / MiB so HiGHS's tolerances mean something.
    time = np.array([cost(c, "time") * 1e3 for c in columns])
    memory = np.array([cost(c, "memory") / 2**20 for c in columns])
    rows, lower, upper = [], [], []
    one = np.zeros(n)
    for b in options:
        one[index[(b, None, None)]] = 1
    rows.append(one), lower.append(1), upper.append(1)
    for b, option in options.items():
        for g, choices in enumerate(option.groups):
            row = np.zeros(n)
            row[index[(b, None, None)]] = -1
            for i in range(len(choices)):
                row[index[(b, g, i)]] = 1
            rows.append(row), lower.append(0), upper.append(0)
    if budget is not None:
        rows.append(memory), lower.append(-np.inf), upper.append(budget / 2**20)
    for solution in excluded:  # no-good cuts: not all of its columns again
        option = options[solution.batch]
        chosen = [(solution.batch, None, None)] + [
            (solution.batch, g, [c.name for c in option.groups[g]].index(name))
            for g, name in enumerate(solution.choices)]
        cut = np.zeros(n)
        for c in chosen:
            cut[index[c]] = 1
        rows.append(cut), lower.append(-np.inf), upper.append(len(chosen) - 1)
    found: list[Solution] = []
    while len(found) < solutions:
        objective = time if minimize == "time" else memory
        result = milp(objective, integrality=np.ones(n), bounds=Bounds(0, 1),
                      constraints=LinearConstraint(np.array(rows), lower, upper))
        if result.x is None:
            break
        chosen = [columns[k] for k in range(n) if result.x[k] > 0.5]
        batch = next(b for b, g, _ in chosen if g is None)
        picks = {g: i for _, g, i in chosen if g is not None}
        option = options[batch]
        names = tuple(option.groups[g][picks[g]].name for g in range(len(option.groups)))
        found.append(Solution(batch, names, float(sum(cost(c, "time") for c in chosen)),
                              float(sum(cost(c, "memory") for c in chosen))))
        cut = np.zeros(n)  # no-good: not all of these again
        for c in chosen:
            cut[index[c]] = 1
        rows.append(cut), lower.append(-np.inf), upper.append(len(chosen) - 1)
    return found
