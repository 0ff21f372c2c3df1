"""A loop on the device: a token's step traced once, run by ``jax.lax.while_loop`` until a
count is reached or every sequence has finished, as one op of one program.

A compiled step per token still costs the host one launch per token (~0.2 ms of Python
and dispatch; on a small model that is the token's whole time). Here the host launches
once per ``generate`` call: the loop's condition reads the finished flags on the device,
so no token waits for the host, and the host reads the tokens once at the end.

The step is recorded on stand-ins (``interop.trace``) and replayed as the loop's body: its
``carried`` inputs are the state it updates in place (the cache, the ids, the flags, the
token buffer, the step counter), returned as the body's outputs; ``read_only`` inputs and
the tensors it reads from outside (the weights: ``constants``) enter every iteration
unchanged.

Example::

    op, constants, checks = DeviceLoop.of(one_token, carried, read_only, flags_at=k)
    new = record_op(op, [count, *carried, *read_only, *constants])
    if checks:
        index_checks.fold(new.pop(), checks)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from torchspmd.device.tensor import SpmdTensor
from torchspmd.interop.jax_op import JaxOp
from torchspmd.interop.trace import TracedFunction, trace

__all__ = ["DeviceLoop"]

# TracedFunction.key and layout -> the loop op (one op, so one lowering, per body)
_LOOPS: dict[tuple, "DeviceLoop"] = {}


class DeviceLoop(JaxOp):
    """``(count, *carried, *read_only, *constants) -> carried``: ``body`` run while fewer
    than ``count`` iterations ran and (with ``flags_at``) any of the carried flags at that
    position is non-zero. A body with index checks (``TracedFunction.checks``) also
    returns their flag, last: the first iteration's failing check."""

    def __init__(self, body: TracedFunction, carried: int, read_only: int, constants: int,
                 flags_at: int | None):
        super().__init__(f"device_loop({carried} carried tensors)")
        self.body, self.carried, self.read_only, self.flags_at = body, carried, read_only, flags_at
        self.count = 1 + carried + read_only + constants

    @classmethod
    def of(cls, step: Callable[..., list], carried: list[SpmdTensor],
           read_only: list[SpmdTensor], flags_at: int | None = None
           ) -> tuple["DeviceLoop", list[SpmdTensor], tuple[str, ...]]:
        """The loop op of ``step(*carried, *read_only)``, which updates the carried tensors
        in place and returns them; the tensors it reads from outside (its constants); and
        the messages of its index checks (the op's last output is then their flag, for
        ``index_checks.fold``)."""
        metas = [t.handle.meta for t in (*carried, *read_only)]
        traced, constants, outs = trace(step, metas, caller="generate's device loop",
                                        mutable=len(carried))
        expected = metas[:len(carried)]
        if [(m.shape, m.dtype) for m in outs] != [(m.shape, m.dtype) for m in expected]:
            raise ValueError(
                "torchspmd: generate's device loop: a token's step must return its carried "
                f"tensors unchanged in shape and dtype; expected {_shapes(expected)}, got "
                f"{_shapes(outs)}.")
        key = (traced.key, len(carried), len(read_only), flags_at)
        op = _LOOPS.get(key)
        if op is None:
            op = _LOOPS[key] = cls(traced, len(carried), len(read_only), len(constants),
                                   flags_at)
        return op, constants, traced.checks

    def flat(self, count, *arrays) -> list:
        carried = list(arrays[:self.carried])
        read_only = list(arrays[self.carried:self.carried + self.read_only])
        constants = list(arrays[self.carried + self.read_only:])

        def more(state) -> jax.Array:
            i, values, _ = state
            going = i < count
            if self.flags_at is not None:
                going = going & jnp.any(values[self.flags_at] != 0)
            return going

        def token(state):
            i, values, flag = state
            values = self.body.replay([*values, *read_only], constants)
            if self.body.checks:
                *values, checks = values
                flag = jnp.where(flag == 0, checks, flag)
            return i + 1, values, flag

        start = (jnp.zeros((), count.dtype), carried, jnp.zeros((), jnp.int32))
        _, out, flag = jax.lax.while_loop(more, token, start)
        return [*out, flag] if self.body.checks else list(out)

    def _infer(self, structs) -> tuple[list, Any]:
        leaves = [jax.ShapeDtypeStruct(*s) for s in structs[1:1 + self.carried]]
        if self.body.checks:
            leaves.append(jax.ShapeDtypeStruct((), jnp.int32))
        return leaves, jax.tree_util.tree_structure(leaves)


def _shapes(metas) -> list[tuple]:
    return [(tuple(m.shape), str(m.dtype).replace("torch.", "")) for m in metas]

