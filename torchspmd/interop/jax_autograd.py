"""Autograd for JaxOps: residuals saved by a forward node, a backward node that uses them.

``_JaxFunction`` is an ``autograd.Function``. With gradients on, the node recorded is
:class:`JaxForward` (the op under ``jax.vjp``: its outputs and the residuals the
backward needs), and the backward is another node, :class:`JaxBackward`, which rebuilds
the pullback from those residuals, so the forward runs once, as with PyTorch's saved
tensors. Under ``create_graph=True`` the backward is :class:`JaxVjp` instead (recomputing
from the inputs, which carry autograd history), so second derivatives work too.

Example::

    (y,) = apply(op, [x])          # differentiable when x requires grad
    y.sum().backward()             # x.grad from a JaxBackward node
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.interop.jax_op import JaxOp, Structs, is_differentiable, record_op, structs_of

__all__ = ["JaxVjp", "JaxForward", "JaxBackward", "apply", "vjp_op", "forward_op"]


class JaxVjp(JaxOp):
    """``(inputs..., cotangents...) -> gradients`` of ``primal`` by ``jax.vjp``.

    One cotangent per output of ``primal`` (those of integer outputs are ignored:
    integers have no gradient); the outputs are the gradients of the floating inputs,
    in input order.
    """

    def __init__(self, primal: JaxOp):
        super().__init__(f"{primal.__name__}.vjp")
        self.primal = primal

    @property
    def count(self) -> int:
        return self.primal.count + self.primal.n_outputs

    def _split(self, structs: Structs) -> tuple[Structs, list[int], list[int]]:
        """The forward's inputs, which of them are differentiated, which outputs count."""
        inputs = structs[: self.primal.count]
        outs = self.primal.outputs(inputs)[0]
        wrt = [i for i, (_, dtype) in enumerate(inputs) if is_differentiable(dtype)]
        return inputs, wrt, [i for i, s in enumerate(outs) if is_differentiable(s.dtype)]

    def flat(self, *arrays) -> list:
        inputs, wrt, outs = self._split(structs_of(arrays))
        primals, cotangents = list(arrays[: len(inputs)]), list(arrays[len(inputs):])

        def f(*diff):
            full = list(primals)
            for i, d in zip(wrt, diff):
                full[i] = d
            out = self.primal.flat(*full)
            return [out[i] for i in outs]

        _, pullback = jax.vjp(f, *[primals[i] for i in wrt])
        return list(pullback([cotangents[i] for i in outs]))

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        inputs, wrt, _ = self._split(structs)
        leaves = [jax.ShapeDtypeStruct(*inputs[i]) for i in wrt]
        return leaves, jax.tree_util.tree_structure(leaves)


class JaxForward(JaxOp):
    """``op``'s outputs followed by the residuals of its ``jax.vjp``.

    Differentiating ``op`` this way computes its forward once: the backward node
    (:meth:`backward`) rebuilds the pullback from the residuals, as PyTorch's autograd
    reuses saved tensors. The pullback's structure (which holds the backward's jaxpr)
    is static per input layout and is kept here, keyed by it.
    """

    def __init__(self, op: JaxOp):
        super().__init__(f"{op.__name__}.forward")
        self.op, self.count = op, op.count
        self.pullbacks: dict[Structs, Any] = {}  # input layout -> the pullback's treedef
        self._backwards: dict[Structs, JaxBackward] = {}

    def flat(self, *arrays) -> list:
        arrays = _distinct(arrays)
        structs = structs_of(arrays)
        outs = self.op.outputs(structs)[0]
        wrt = [i for i, (_, dtype) in enumerate(structs) if is_differentiable(dtype)]
        floats = [i for i, s in enumerate(outs) if is_differentiable(s.dtype)]
        others = [i for i in range(len(outs)) if i not in floats]

        def f(*diff):
            full = list(arrays)
            for i, d in zip(wrt, diff):
                full[i] = d
            out = self.op.flat(*full)
            return [out[i] for i in floats], [out[i] for i in others]

        float_outs, pullback, other_outs = jax.vjp(f, *[arrays[i] for i in wrt], has_aux=True)
        results = [None] * len(outs)
        for i, v in zip(floats, float_outs):
            results[i] = v
        for i, v in zip(others, other_outs):
            results[i] = v
        residuals, self.pullbacks[structs] = jax.tree_util.tree_flatten(pullback)
        return results + residuals

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        leaves = jax.eval_shape(lambda *a: self.flat(*a),
                                *[jax.ShapeDtypeStruct(s, d) for s, d in structs])
        return leaves, jax.tree_util.tree_structure(leaves)

    def backward(self, structs: Structs) -> "JaxBackward":
        """The op ``(residuals..., cotangents...) -> input gradients`` for inputs ``structs``."""
        op = self._backwards.get(structs)
        if op is None:
            op = self._backwards[structs] = JaxBackward(self, structs)
        return op


class JaxBackward(JaxOp):
    """``(residuals..., cotangents...) -> gradients`` of a :class:`JaxForward`'s op.

    One cotangent per output of the op (those of integer outputs are ignored); the
    outputs are the gradients of the op's floating inputs, in input order.
    """

    def __init__(self, forward: JaxForward, structs: Structs):
        super().__init__(f"{forward.op.__name__}.backward")
        self.source, self.structs = forward, structs
        self.residuals = forward.pullbacks[structs].num_leaves
        self.count = self.residuals + forward.op.n_outputs

    def flat(self, *arrays) -> list:
        residuals, cotangents = arrays[: self.residuals], arrays[self.residuals:]
        pullback = jax.tree_util.tree_unflatten(self.source.pullbacks[self.structs], residuals)
        outs = self.source.op.outputs(self.structs)[0]
        return list(pullback([c for c, s in zip(cotangents, outs) if is_differentiable(s.dtype)]))

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        leaves = [jax.ShapeDtypeStruct(s, d) for s, d in self.structs if is_differentiable(d)]
        return leaves, jax.tree_util.tree_structure(leaves)


def _distinct(arrays) -> list:
    """``arrays`` with a value passed twice (one tensor given as two arguments) made two.

    ``jax.vjp``'s residuals depend on which inputs are one object, and a forward node's
    output count is fixed by shape inference, where every input is its own. The copy is
    no instruction in the program.
    """
    seen: set[int] = set()
    out = []
    for a in arrays:
        out.append(jnp.array(a, copy=True) if id(a) in seen else a)
        seen.add(id(a))
    return out


def vjp_op(op: JaxOp) -> "JaxVjp":
    """The op computing ``op``'s input gradients by recomputing it (second derivatives)."""
    if op._vjp is None:
        op._vjp = JaxVjp(op)
    return op._vjp


def forward_op(op: JaxOp) -> "JaxForward":
    """``op``, also returning the residuals its backward needs."""
    if op._forward is None:
        op._forward = JaxForward(op)
    return op._forward


def apply(op: JaxOp, tensors: list[SpmdTensor]) -> list[SpmdTensor]:
    """``op`` on ``tensors``: recorded, and differentiable when a tensor requires grad."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_JaxFunction.apply(op, *tensors))
    return record_op(op, tensors)


class _JaxFunction(torch.autograd.Function):
    """Autograd for a :class:`JaxOp`: the forward records its :class:`JaxForward` (outputs
    and residuals), the backward its :class:`JaxBackward`. Under ``create_graph=True`` the
    backward is :class:`JaxVjp` of the inputs instead, so that it is differentiable in
    turn (residuals carry no autograd history)."""

    @staticmethod
    def forward(ctx, op: JaxOp, *tensors: torch.Tensor):
        forward = forward_op(op)
        recorded = record_op(forward, tensors)
        outputs, residuals = recorded[: op.n_outputs], recorded[op.n_outputs:]
        ctx.op, ctx.count = op, len(tensors)
        ctx.backward_op = forward.backward(structs_of(tensors))
        ctx.floating = [_floating(t) for t in tensors]
        ctx.save_for_backward(*tensors, *residuals)
        ctx.mark_non_differentiable(*[o for o in outputs if not _floating(o)])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        saved = ctx.saved_tensors
        inputs, residuals = saved[: ctx.count], saved[ctx.count:]
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = iter(apply(vjp_op(ctx.op), [*inputs, *cotangents]))
        else:
            grads = iter(apply(ctx.backward_op, [*residuals, *cotangents]))
        return (None, *[next(grads) if floating else None for floating in ctx.floating])


def _floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
