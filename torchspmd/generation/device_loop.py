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

    op, constants, messages = DeviceLoop.of(one_token, carried, read_only, flags_at=k)
    *new, flag = record_op(op, [count, *carried, zero_int32, *read_only, *constants])
    index_checks.fold(flag, messages)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch

from torchspmd.device import index_checks
from torchspmd.device.tensor import SpmdTensor
from torchspmd.interop.jax_op import JaxOp
from torchspmd.interop.trace import TracedFunction, trace

__all__ = ["DeviceLoop"]

# TracedFunction.key and layout -> the loop op (one op, so one lowering, per body)
_LOOPS: dict[tuple, "DeviceLoop"] = {}


class DeviceLoop(JaxOp):
    """``(count, *carried, flag, *read_only, *constants) -> (*carried, flag)``: ``body`` run while fewer
    than ``count`` iterations ran and (with ``flags_at``) any of the carried flags at that
    position is non-zero."""

    def __init__(self, body: TracedFunction, carried: int, read_only: int, constants: int,
                 flags_at: int | None):
        super().__init__(f"device_loop({carried} carried tensors)")
        self.body, self.carried, self.read_only, self.flags_at = body, carried, read_only, flags_at
        self.count = 1 + carried + read_only + constants

    @classmethod
    def of(cls, step: Callable[..., list], carried: list[SpmdTensor],
           read_only: list[SpmdTensor], flags_at: int | None = None
           ) -> tuple["DeviceLoop", list[SpmdTensor], list[str]]:
        """The loop op of ``step(*carried, *read_only)``, which updates the carried tensors
        in place and returns them; the tensors it reads from outside (its constants); and
        the messages of its index checks.

        The op carries one more value, last: the body's index-check flag (``0``, or the
        number of the message of the first indexing op whose index was out of range, in
        the first iteration that had one). Its caller passes an int32 zero for it and
        folds the result into the graph's checks (``index_checks.fold``)."""
        messages: list[str] = []

        def body(*tensors):
            outside = index_checks.take_flag()  # the body's checks are its own
            try:
                outs = step(*tensors[:len(carried)], *tensors[len(carried) + 1:])
                checks = index_checks.take_flag()
            finally:
                index_checks.restore_flag(outside)
            before = tensors[len(carried)]
            if checks is None:
                return [*outs, before]
            messages.extend(checks.messages)
            return [*outs, torch.where(before.eq(0), checks.tensor, before)]

        flag = torch.zeros((), dtype=torch.int32, device=carried[0].device)
        metas = [t.handle.meta for t in (*carried, flag, *read_only)]
        traced, constants, outs = trace(body, metas, caller="generate's device loop",
                                        mutable=len(carried))
        expected = metas[:len(carried) + 1]
        if [(m.shape, m.dtype) for m in outs] != [(m.shape, m.dtype) for m in expected]:
            raise ValueError(
                "torchspmd: generate's device loop: a token's step must return its carried "
                f"tensors unchanged in shape and dtype; expected {_shapes(expected)}, got "
                f"{_shapes(outs)}.")
        key = (traced.key, len(carried), len(read_only), flags_at)
        op = _LOOPS.get(key)
        if op is None:
            op = _LOOPS[key] = cls(traced, len(carried) + 1, len(read_only), len(constants),
                                   flags_at)
        return op, constants, messages

    def flat(self, count, *arrays) -> list:
        carried = list(arrays[:self.carried])
        read_only = list(arrays[self.carried:self.carried + self.read_only])
        constants = list(arrays[self.carried + self.read_only:])

        def more(state) -> jax.Array:
            i, values = state
            going = i < count
            if self.flags_at is not None:
                going = going & jnp.any(values[self.flags_at] != 0)
            return going

        def token(state):
            i, values = state
            return i + 1, self.body.replay([*values, *read_only], constants)

        _, out = jax.lax.while_loop(more, token, (jnp.zeros((), count.dtype), carried))
        return list(out)

    def _infer(self, structs) -> tuple[list, Any]:
        leaves = [jax.ShapeDtypeStruct(*s) for s in structs[1:1 + self.carried]]
        return leaves, jax.tree_util.tree_structure(leaves)


def _shapes(metas) -> list[tuple]:
    return [(tuple(m.shape), str(m.dtype).replace("torch.", "")) for m in metas]

