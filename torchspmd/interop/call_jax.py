"""``call_jax``: a JAX function as one node of the lazy graph, differentiable through ``jax.vjp``.

The function is not run when called: a :class:`JaxCall` is an op like an aten overload.
Its shape inference is ``jax.eval_shape``; its lowering calls the function on the graph's
JAX values while the step is traced, so it is compiled with the rest of the step and
shardings flow through it both ways (``with_sharding_constraint`` and ``jax.shard_map``
inside it are seen by XLA's partitioner like any other op). Inside a manual-sharding
region it receives local blocks, as every op there does.

Gradients: ``_JaxFunction`` is an ``autograd.Function`` whose backward is another op,
:class:`JaxVjp` (the ``jax.vjp`` of the function; the forward is recomputed inside it,
and when both are in one graph XLA removes the duplicate). The backward goes through the
same ``autograd.Function``, so second derivatives work too.

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

__all__ = ["call_jax", "JaxCall", "JaxVjp"]

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
        """The op computing this op's input gradients from its outputs' cotangents."""
        if self._vjp is None:
            self._vjp = JaxVjp(self)
        return self._vjp


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
    """``(inputs..., cotangents...) -> gradients`` of ``forward`` by ``jax.vjp``.

    One cotangent per output of ``forward`` (those of integer outputs are ignored:
    integers have no gradient); the outputs are the gradients of the floating inputs,
    in input order.
    """

    def __init__(self, forward: JaxOp):
        super().__init__(f"{forward.__name__}.vjp")
        self.forward = forward

    @property
    def count(self) -> int:
        return self.forward.count + self.forward.n_outputs

    def _split(self, structs: Structs) -> tuple[Structs, list[int], list[int]]:
        """The forward's inputs, which of them are differentiated, which outputs count."""
        inputs = structs[: self.forward.count]
        outs = self.forward.outputs(inputs)[0]
        wrt = [i for i, (_, dtype) in enumerate(inputs) if is_differentiable(dtype)]
        return inputs, wrt, [i for i, s in enumerate(outs) if is_differentiable(s.dtype)]

    def flat(self, *arrays) -> list:
        inputs, wrt, outs = self._split(structs_of(arrays))
        primals, cotangents = list(arrays[: len(inputs)]), list(arrays[len(inputs):])

        def f(*diff):
            full = list(primals)
            for i, d in zip(wrt, diff):
                full[i] = d
            out = self.forward.flat(*full)
            return [out[i] for i in outs]

        _, pullback = jax.vjp(f, *[primals[i] for i in wrt])
        return list(pullback([cotangents[i] for i in outs]))

    def _infer(self, structs: Structs) -> tuple[list, Any]:
        inputs, wrt, _ = self._split(structs)
        leaves = [jax.ShapeDtypeStruct(*inputs[i]) for i in wrt]
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
    """Autograd for a :class:`JaxOp`: the backward records the op's :class:`JaxVjp`."""

    @staticmethod
    def forward(ctx, op: JaxOp, *tensors: torch.Tensor):
        outputs = _record(op, tensors)
        ctx.op = op
        ctx.save_for_backward(*tensors)
        ctx.mark_non_differentiable(*[o for o in outputs if not _floating(o)])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        tensors = ctx.saved_tensors
        grads = iter(apply(ctx.op.vjp(), [*tensors, *cotangents]))
        return (None, *[next(grads) if _floating(t) else None for t in tensors])


def _floating(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
