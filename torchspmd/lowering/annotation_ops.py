"""Pseudo-ops that carry sharding annotations through the graph.

They are recorded like aten ops (same node, signature and key machinery), and lowered to
JAX's sharding constraints, which XLA's SPMD partitioner reads. A constraint's sharding is
the annotation the user wrote; what XLA is given for it follows ``xla_shardings``'s rules
(uneven annotations become replicated, devices go in id order).
"""

from __future__ import annotations

import jax

from torchspmd.lowering import jax_private
from torchspmd.lowering.registry import lowers
from torchspmd.lowering.xla_shardings import constraint_for


class AnnotationOp:
    """An op that returns its input unchanged on the meta device (shape inference)."""

    def __init__(self, name: str):
        self.__name__ = name

    def __call__(self, x, *static):
        return x

    def __repr__(self) -> str:
        return f"torchspmd.{self.__name__}"


# sharding_constraint(x, sharding): x, laid out as ``sharding`` (a jax NamedSharding).
SHARDING_CONSTRAINT = AnnotationOp("sharding_constraint")


@lowers(SHARDING_CONSTRAINT)
def sharding_constraint(meta, x, sharding):
    if 1 in x.shape:
        # XLA's SPMD partitioner builds an invalid program (an all-gather of the wrong
        # shape, "Expected instruction to have shape equal to f32[4,2]") for a
        # constraint on a slice of size 1 taken at the start of a dimension split in
        # shards of size 1 (`t.narrow(1, 0, 1)` of a tensor sharded 2 ways on 2
        # columns). A barrier keeps it from looking through to the slice.
        # tests/lowering/test_xla_size_one_slice.py holds the plain-JAX repro.
        x = jax.lax.optimization_barrier(x)
    return jax.lax.with_sharding_constraint(x, constraint_for(sharding, x.shape))


class PairAnnotationOp(AnnotationOp):
    """A two-input, two-output annotation op: returns both inputs unchanged (shape inference)."""

    def __call__(self, x, y, *static):
        return x, y


# shard_alike(x, y): (x, y), laid out alike (the layout of whichever has one; spec §1.6).
SHARD_ALIKE = PairAnnotationOp("shard_alike")


@lowers(SHARD_ALIKE)
def shard_alike(meta, x, y):
    return jax_private.shard_alike(x, y)


class ReshapingAnnotationOp(AnnotationOp):
    """An annotation whose output has another shape: ``op(x, sharding, shape)``."""

    def __call__(self, x, sharding, shape):
        return x.new_empty(shape)


# Manual-sharding region boundaries (``enable_manual_sharding`` / ``disable_manual_sharding``):
# full_to_shard(x, sharding, local_shape) gives each device its block of x;
# shard_to_full(x, sharding, full_shape) reassembles the blocks. The program lowers the
# ops between them as one ``jax.shard_map`` body (``runtime/manual_regions.py``), so they have no
# entry in the lowering table.
FULL_TO_SHARD = ReshapingAnnotationOp("full_to_shard")
SHARD_TO_FULL = ReshapingAnnotationOp("shard_to_full")
