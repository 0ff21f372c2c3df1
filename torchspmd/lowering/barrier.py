"""``optimization_barrier``: a value XLA may not look through (PyTorch/XLA's
``xm.optimization_barrier_``).

Activation checkpointing recomputes a block's forward in the backward pass. To XLA that
recomputation is the same expression as the forward, so common-subexpression elimination
merges the two and the activations stay alive after all: no memory is saved. Recomputing
from a fenced copy of the block's inputs makes the expressions different.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from torchspmd.lowering.annotation_ops import AnnotationOp
from torchspmd.lowering.registry import lowers

class _AfterOp(AnnotationOp):
    """Returns its first input unchanged (shape inference); the second is only waited for."""

    def __call__(self, x, after):
        return x


# optimization_barrier(x): x, which XLA must treat as an opaque new value.
OPTIMIZATION_BARRIER = AnnotationOp("optimization_barrier")
# optimization_barrier_after(x, after): the same, and not available before ``after`` is
# computed (so XLA cannot schedule what uses it earlier, e.g. recomputation in the forward).
OPTIMIZATION_BARRIER_AFTER = _AfterOp("optimization_barrier_after")


@lowers(OPTIMIZATION_BARRIER)
def optimization_barrier(meta, x):
    return jax.lax.optimization_barrier(x)


@lowers(OPTIMIZATION_BARRIER_AFTER)
def optimization_barrier_after(meta, x, after):
    # XLA's CPU and GPU pipelines turn barriers into scheduling hints early, and CSE then
    # merges what they fenced (jax.checkpoint saves no memory on CPU for this reason).
    # So the value also goes through a select on a predicate computed from ``after``:
    # true for every float, NaN included, but not a constant XLA can fold, so the result
    # is a new value that exists only once ``after`` does.
    x, after = jax.lax.optimization_barrier((x, after))
    if after.size == 0 or not jnp.issubdtype(after.dtype, jnp.floating):
        return x
    a = after.reshape(-1)[0]
    always = (a == a) | (a != a)
    return jnp.where(always, x, jnp.zeros_like(x))
