"""``call_jax``: a JAX function as one node of the lazy graph, differentiable through ``jax.vjp``.

The function is not run when called: a :class:`JaxCall` is an op like an aten overload.
Its shape inference is ``jax.eval_shape``; its lowering calls the function on the graph's
JAX values while the step is traced, so it is compiled with the rest of the step and
shardings flow through it both ways (``with_sharding_constraint`` and ``jax.shard_map``
inside it are seen by XLA's partitioner like any other op). Inside a manual-sharding
region it receives local blocks, as every op there does.

Gradients (``jax_autograd.py``): a forward node that also returns ``jax.vjp``'s residuals,
and a backward node that rebuilds the pullback from them, so the forward runs once;
second derivatives work too.

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
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.interop.jax_autograd import apply
from torchspmd.interop.jax_op import JaxOp, Structs, structs_of
from torchspmd.sharding.sharded_tensor import XLAShardedTensor

__all__ = ["call_jax", "JaxCall"]


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
