"""``torch_xla.experimental.scan.scan``: ``fn`` over the leading dim of ``xs``, carrying state.

torchspmd records the loop unrolled (values as ``lax.scan``'s); ``torchspmd.scan_layers``
compiles a stack of layers as one scan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree


def scan(fn: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any,
         partition_fn=None, is_fn_pure: bool = True) -> tuple[Any, Any]:
    """``carry, y = fn(carry, x)`` for each ``x`` along dim 0 of ``xs``; returns the last
    carry and the ``y``s stacked along dim 0.

    Example::

        >>> final, sums = scan(lambda c, x: (c + x, c + x), torch.zeros(1), torch.ones(3, 1))
    """
    if partition_fn is not None:
        from torchspmd.compat.errors import unsupported

        unsupported("scan(partition_fn=...)", "torchspmd records the loop unrolled; use "
                    "torch.utils.checkpoint inside fn to recompute")
    leaves, spec = pytree.tree_flatten(xs)
    if not leaves:
        raise ValueError("scan: xs has no tensors to iterate over")
    length = leaves[0].shape[0]
    carry, ys = init, []
    for i in range(length):
        carry, y = fn(carry, pytree.tree_unflatten([leaf[i] for leaf in leaves], spec))
        ys.append(y)
    y_leaves = [pytree.tree_flatten(y)[0] for y in ys]
    y_spec = pytree.tree_flatten(ys[0])[1] if ys else None
    stacked = [torch.stack(column) for column in zip(*y_leaves)]
    return carry, (pytree.tree_unflatten(stacked, y_spec) if y_spec is not None else None)
