"""The layers' tensors stacked for ``scan_layers``, and the stacked gradient split back.

``stack_layers`` is ``torch.stack`` of one tensor of every layer, sharded as the first
layer's tensor was (layer axis unsharded). Its gradient is split back into one gradient
per layer, and how matters for compile time, not for values:

XLA:CPU compiles each *distinct* fused kernel once and reuses it for identical ones (its
log says "Reusing kernel"). ``torch.stack``'s own backward takes row ``i`` of the stacked
gradient as a slice at the constant offset ``i``; XLA fuses that slice into the consumer
(the optimizer's update of layer ``i``), so every (layer, parameter) pair became its own
kernel: 114 of the 259 kernels XLA compiled for a 16-layer decoder step. Here row ``i``
is a ``dynamic_slice`` at an index that is program *data* (a host scalar, one per layer),
so the kernels of all layers are identical and XLA compiles one per parameter shape.

Example::

    stacked = stack_layers([layer.weight for layer in layers])   # [L, *weight.shape]
    stacked.sum().backward()      # layers[i].weight.grad: row i of the stacked gradient
"""

from __future__ import annotations

from typing import Any

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from torchspmd.interop.jax_autograd import apply
from torchspmd.interop.jax_op import JaxOp, Structs
from torchspmd.sharding import state

__all__ = ["stack_layers"]


class _Row(JaxOp):
    """``(stacked, index) -> stacked[index]`` with ``index`` an int32 value of the program."""

    count = 2

    def flat(self, stacked, index) -> list:
        return [jax.lax.dynamic_index_in_dim(stacked, index, 0, keepdims=False)]

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        (shape, dtype), _ = structs
        leaves = [jax.ShapeDtypeStruct(shape[1:], dtype)]
        return leaves, jax.tree_util.tree_structure(leaves)


ROW = _Row("scan_layers.row")


class _StackLayers(torch.autograd.Function):
    """``torch.stack`` whose backward takes each row at a runtime index (see module doc)."""

    @staticmethod
    def forward(ctx, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.count = len(tensors)
        return torch.stack(tensors)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # A host scalar becomes a parameter of the program, which XLA cannot fold into
        # the kernel as a constant (as it would an index computed in the program).
        return tuple(apply(ROW, [grad, torch.tensor(i, dtype=torch.int32).to(grad.device)])[0]
                     for i in range(ctx.count))


def stack_layers(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)`` (spmd tensors of one shape), sharded as ``tensors[0]`` is
    with the new leading axis unsharded; its gradient reaches each tensor's ``.grad``.

    Example::

        >>> stack_layers([l.weight for l in layers]).shape    # (len(layers), *weight.shape)
    """
    out = _StackLayers.apply(*tensors)
    sharding = state.jax_sharding_of(state.current_value(tensors[0]))
    if isinstance(sharding, NamedSharding):
        spec = PartitionSpec(None, *sharding.spec)
        stacked = NamedSharding(sharding.mesh, spec)
        state.annotate(out, state.constrain(state.current_value(out), stacked))
    return out
