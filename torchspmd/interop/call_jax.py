"""``call_jax``: a JAX function as one node of the lazy graph, differentiable through ``jax.vjp``.

The function is not run when called: a :class:`JaxCall` is an op like an aten overload.
Its shape inference is ``jax.eval_shape``; its lowering calls the function on the graph's
JAX values while the step is traced, so it is compiled with the rest of the step and
shardings flow through it both ways (``with_sharding_constraint`` and ``jax.shard_map``
inside it are seen by XLA's partitioner like any other op). Inside a manual-sharding
region it receives local blocks, as every op there does.

Gradients: ``_JaxFunction`` is an ``autograd.Function``. With gradients on, the node
recorded is :class:`JaxForward` (the function under ``jax.vjp``: outputs and the
residuals the backward needs), and the backward is another node, :class:`JaxBackward`,
which rebuilds the pullback from those residuals, so the forward runs once, as with
PyTorch's saved tensors. The backward node is differentiable in turn (by recomputation,
:class:`JaxVjp`), so second derivatives work too.

Ops are interned on ``(fn, argument structure, static arguments)``: calling the same
function the same way each step reuses one op, hence one compiled program. A new function
object each step (a fresh ``lambda`` or ``functools.partial``) is a new op and recompiles.

Example::

    import jax, torchspmd
    q = k = v = torch.randn(2, 16, 4, 8, device="spmd", requires_grad=True)
    out = torchspmd.call_jax(jax.nn.dot_product_attention, q, k, v, is_causal=True)
    out.sum().backward()          # q.grad from jax.vjp, in the same compiled step
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TENSOR
from torchspmd.lazy.record import record
from torchspmd.lowering.dtypes import to_jax_dtype, to_torch_dtype
from torchspmd.lowering.registry import LOWERINGS
from torchspmd.sharding.sharded_tensor import XLAShardedTensor

__all__ = ["call_jax", "JaxOp", "JaxCall", "JaxVjp", "JaxForward", "JaxBackward"]

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
        self._vjp: JaxVjp | None = None
        self._forward: JaxForward | None = None
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

    def vjp(self) -> "JaxVjp":
        """The op computing this op's input gradients from its outputs' cotangents
        (recomputing the forward: used for second derivatives)."""
        if self._vjp is None:
            self._vjp = JaxVjp(self)
        return self._vjp

    def forward(self) -> "JaxForward":
        """This op, also returning the residuals its backward needs (see :class:`JaxForward`)."""
        if self._forward is None:
            self._forward = JaxForward(self)
        return self._forward


class _TensorLeaf:
    __slots__ = ()

    def __repr__(self) -> str:
        return "TENSOR"


TENSOR_LEAF = _TensorLeaf()

# (fn, in_tree, template) -> JaxCall. Ops live as long as the process, as aten overloads do.
_CALLS: dict[tuple, "JaxCall"] = {}


class JaxCall(JaxOp):
    """``fn(*args, **kwargs)`` where the tensors of ``(args, kwargs)`` are graph inputs.

    ``template`` is the flattened ``(args, kwargs)`` with :data:`TENSOR_LEAF` where a tensor
    goes and the static value elsewhere; ``in_tree`` rebuilds the structure from it.
    """

    def __init__(self, fn: Callable, in_tree, template: tuple):
        super().__init__(f"call_jax({getattr(fn, '__name__', type(fn).__name__)})")
        self.fn, self.in_tree, self.template = fn, in_tree, template
        self.count = sum(t is TENSOR_LEAF for t in template)

    @classmethod
    def get(cls, fn: Callable, in_tree, template: tuple) -> "JaxCall":
        """The interned op for this function and call structure."""
        key = (fn, in_tree, template)
        try:
            op = _CALLS.get(key)
        except TypeError as e:
            raise TypeError(f"torchspmd: call_jax's non-tensor arguments must be hashable "
                            f"(they are compiled into the program): {e}. Pass arrays as "
                            "tensors.") from None
        if op is None:
            op = _CALLS[key] = cls(fn, in_tree, template)
        return op

    def _call(self, arrays) -> Any:
        it = iter(arrays)
        leaves = [next(it) if t is TENSOR_LEAF else t for t in self.template]
        args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, leaves)
        return self.fn(*args, **kwargs)

    def flat(self, *arrays) -> list:
        return jax.tree_util.tree_leaves(self._call(arrays))

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        out = jax.eval_shape(lambda *a: self._checked(self._call(a)),
                             *[jax.ShapeDtypeStruct(s, d) for s, d in structs])
        return jax.tree_util.tree_flatten(out)

    def _checked(self, out: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(out)
        for leaf in leaves:
            if not isinstance(leaf, jax.Array):
                raise TypeError(f"torchspmd: {self.__name__} returned {leaf!r}; call_jax "
                                "outputs must be JAX arrays (in any pytree).")
        if not leaves:
            raise ValueError(f"torchspmd: {self.__name__} returned no arrays; call_jax needs "
                             "at least one array output.")
        return out


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


def is_differentiable(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def structs_of(values) -> Structs:
    """``((shape, numpy dtype), ...)`` of torch tensors or JAX arrays/structs."""
    return tuple((tuple(v.shape), to_jax_dtype(v.dtype) if isinstance(v.dtype, torch.dtype)
                  else jnp.dtype(v.dtype)) for v in values)


def call_jax(jax_fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``jax_fn(*args, **kwargs)`` as one node of the step's graph; spmd tensors out.

    Tensor arguments (anywhere in pytrees of ``args``/``kwargs``) reach ``jax_fn`` as
    ``jax.Array`` tracers; other arguments are passed as they are and are compiled into
    the program (they must be hashable). The outputs, any pytree of arrays, come back
    as spmd tensors in the same structure. Gradients flow to tensor arguments that
    require them, through ``jax.vjp``.

    Example::

        >>> def gelu_mul(x, y, *, approximate):
        ...     return jax.nn.gelu(x, approximate=approximate) * y
        >>> out = torchspmd.call_jax(gelu_mul, x, y, approximate=True)
    """
    leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    tensors: list[SpmdTensor] = []
    template: list = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, XLAShardedTensor):
            leaf = leaf.global_tensor
        if isinstance(leaf, torch.Tensor):
            if not isinstance(leaf, SpmdTensor):
                raise TypeError(f"torchspmd: call_jax argument {i} is a tensor on {leaf.device}; "
                                "move it to the spmd device first (t.to('spmd')).")
            tensors.append(leaf)
            template.append(TENSOR_LEAF)
        else:
            template.append(leaf)
    op = JaxCall.get(jax_fn, in_tree, tuple(template))
    outputs = apply(op, tensors)
    return jax.tree_util.tree_unflatten(op.outputs(structs_of(tensors))[1], outputs)


def apply(op: JaxOp, tensors: list[SpmdTensor]) -> list[SpmdTensor]:
    """``op`` on ``tensors``: recorded, and differentiable when a tensor requires grad."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_JaxFunction.apply(op, *tensors))
    return _record(op, tensors)


def _record(op: JaxOp, tensors) -> list[SpmdTensor]:
    values = tuple(t._h.value() for t in tensors)
    metas = tuple(t._h.meta for t in tensors)
    node = record(op, (TENSOR,) * len(tensors), (), values, metas)
    return [SpmdTensor(Handle.new((node, i), m)) for i, m in enumerate(node.sig.outputs)]


class _JaxFunction(torch.autograd.Function):
    """Autograd for a :class:`JaxOp`: the forward records its :class:`JaxForward` (outputs
    and residuals), the backward its :class:`JaxBackward`. Under ``create_graph=True`` the
    backward is :class:`JaxVjp` of the inputs instead, so that it is differentiable in
    turn (residuals carry no autograd history)."""

    @staticmethod
    def forward(ctx, op: JaxOp, *tensors: torch.Tensor):
        forward = op.forward()
        recorded = _record(forward, tensors)
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
            grads = iter(apply(ctx.op.vjp(), [*inputs, *cotangents]))
        else:
            grads = iter(apply(ctx.backward_op, [*residuals, *cotangents]))
        return (None, *[next(grads) if floating else None for floating in ctx.floating])


def _floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
