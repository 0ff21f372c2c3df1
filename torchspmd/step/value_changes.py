"""A compiled step captured again and again for new Python values says so, once.

Python numbers, strings and other non-tensor arguments are compiled into a step's program
(``jax.jit``'s static arguments): a value never seen before captures and compiles again.
A decode loop passing its position as an ``int`` compiles every token, correct but
seconds a step on a real model. At the :data:`WARN_AFTER`-th signature of one step whose
non-tensor arguments differ, a :class:`ValueRecompileWarning` names the values that
changed and how to pass them instead, as ``torch.compile`` warns at its recompile limit.

Example::

    for pos in range(20):
        step(token, pos)          # the 8th new pos warns: pass torch.tensor(pos) instead
"""

from __future__ import annotations

import warnings

import torch

from torchspmd.runtime.user_code import user_stacklevel

__all__ = ["ValueRecompileWarning", "WARN_AFTER", "ValueWatch"]

WARN_AFTER = 8  # signatures of one step (torch._dynamo's recompile limit is 8 too)


class ValueRecompileWarning(UserWarning):
    """A compiled step was captured for many values of its non-tensor arguments."""


class ValueWatch:
    """The non-tensor argument values of the signatures one compiled step captured, up to
    the warning (then nothing is kept).

    >>> watch = ValueWatch()
    >>> for pos in range(WARN_AFTER): watch.new_signature("step", [pos])   # doctest: +SKIP
    """

    def __init__(self):
        self._seen: list[tuple] = []
        self._warned = False

    def new_signature(self, name: str, leaves: list) -> None:
        """A call of step ``name`` with these argument leaves found no captured plan."""
        if self._warned:
            return
        values = tuple(leaf for leaf in leaves if not isinstance(leaf, torch.Tensor))
        self._seen.append(values)
        if len(self._seen) < WARN_AFTER:
            return
        self._warned = True
        seen, self._seen = self._seen, []
        columns = list(zip(*[v for v in seen if len(v) == len(values)]))
        changing = [list(dict.fromkeys(repr(x) for x in column)) for column in columns
                    if len({repr(x) for x in column}) > 1]  # each in the order first seen
        if not changing:
            return  # other causes (shapes, layouts, state): their own counters say so
        shown = "; ".join(", ".join(c[:5]) + (", ..." if len(c) > 5 else "") for c in changing)
        warnings.warn(
            f"torchspmd.compile: {name} has been captured and compiled for {len(seen)} "
            f"signatures, each for new values of its non-tensor arguments ({shown}): a "
            "Python number or string is compiled into the program, so each new value "
            "compiles again. Pass a value that changes every call as a tensor on the device "
            "(torch.tensor([pos], device='spmd')) and use it through tensor ops "
            "(cache.index_copy_(0, pos, x), index_select, torch.where; a 0-d tensor used as "
            "a Python index is read on the host), or keep it in a tensor updated in place.",
            ValueRecompileWarning, stacklevel=user_stacklevel())
