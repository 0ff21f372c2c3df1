"""JaxOp: a lazy-graph op computed by a JAX function of the node's tensor inputs.

The base of ``call_jax``'s op, of its autograd ops and of ``scan_layers``' op. Like an aten
overload, a JaxOp is interned (one per distinct computation) and registered in the
lowering table; its shape inference is ``jax.eval_shape``-style (:meth:`JaxOp._infer`),
and :func:`record_op` records it on spmd tensors as one node.

Example::

    class Double(JaxOp):
        count = 1
        def flat(self, x): return [x * 2]
        def _infer(self, structs): ...
    (y,) = record_op(Double("double"), [x])
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TENSOR
from torchspmd.lazy.record import record
from torchspmd.lowering.dtypes import to_jax_dtype, to_torch_dtype
from torchspmd.lowering.registry import LOWERINGS

__all__ = ["JaxOp", "Structs", "is_differentiable", "structs_of", "record_op"]

Structs = tuple  # ((shape, numpy dtype), ...): the inputs an op's outputs are inferred for


class JaxOp:
    """A lazy-graph op computed by a JAX function of the node's tensor inputs.

    Subclasses define :meth:`flat` (the JAX computation, output leaves as a list) and
    :meth:`_infer` (its output ``ShapeDtypeStruct``s and pytree). Creating one registers
    it in the lowering table; ops are interned, so there is one per distinct call.
    """

    def __init__(self, name: str):
        self.__name__ = name
        self._outputs: dict[Structs, tuple[list, Any]] = {}
        self._vjp: JaxOp | None = None  # its autograd ops, made by jax_autograd on demand
        self._forward: JaxOp | None = None
        self.n_outputs = 0  # output leaves, known once inferred (fixed for an interned op)
        LOWERINGS[self] = self.lower

    def __repr__(self) -> str:
        return f"torchspmd.{self.__name__}"

    count: int  # tensor inputs (fixed for an interned op)

    def flat(self, *arrays) -> list:
        raise NotImplementedError

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        raise NotImplementedError

    def outputs(self, structs: Structs) -> tuple[list, Any]:
        """The output leaves' ``ShapeDtypeStruct``s and their tree, for inputs ``structs``."""
        cached = self._outputs.get(structs)
        if cached is None:
            cached = self._outputs[structs] = self._infer(structs)
            self.n_outputs = len(cached[0])
        return cached

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Shape inference on the meta device (what the recorder's signature cache calls)."""
        leaves, _ = self.outputs(structs_of(tensors))
        return tuple(torch.empty(s.shape, dtype=to_torch_dtype(s.dtype), device="meta")
                     for s in leaves)

    def lower(self, meta, *arrays) -> list:
        """The lowering: the computation traced on the graph's JAX values."""
        return self.flat(*arrays)


def is_differentiable(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def structs_of(values) -> Structs:
    """``((shape, numpy dtype), ...)`` of torch tensors or JAX arrays/structs."""
    return tuple((tuple(v.shape), to_jax_dtype(v.dtype) if isinstance(v.dtype, torch.dtype)
                  else jnp.dtype(v.dtype)) for v in values)


def record_op(op: JaxOp, tensors) -> list[SpmdTensor]:
    """``op`` on ``tensors``, recorded as one node (no autograd); its output tensors."""
    values = tuple(t.handle.value() for t in tensors)
    metas = tuple(t.handle.meta for t in tensors)
    node = record(op, (TENSOR,) * len(tensors), (), values, metas)
    return [SpmdTensor(Handle.new((node, i), m)) for i, m in enumerate(node.sig.outputs)]
