"""PyTorch/XLA's sharding annotation API: ``mark_sharding`` and its companions (spec §1.5-§1.6).

``mark_sharding`` annotates a tensor in place and returns an ``XLAShardedTensor`` around
it; ``annotate_custom_sharding`` reshards inside the graph; ``get_sharding`` reads the
V1 text of a tensor's current sharding. Example::

    mesh = Mesh(np.arange(8), (2, 4), ("data", "model"))
    x = torch.randn(16, 128).to("spmd")
    xs.mark_sharding(x, mesh, ("data", None))
    xs.get_sharding(x)   # '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TENSOR
from torchspmd.lazy.provenance import is_recording
from torchspmd.lazy.record import record
from torchspmd.lowering.annotation_ops import SHARD_ALIKE
from torchspmd.sharding import state
from torchspmd.sharding.hlo_text import REPLICATED_TEXT, spec_to_hlo_text
from torchspmd.sharding.mesh import Mesh, check
from torchspmd.sharding.arguments import check_mesh
from torchspmd.sharding.partition_spec import MeshSpec, PartitionSpec, resolve
from torchspmd.sharding.sharded_tensor import XLAShardedTensor
from torchspmd.sharding.traceable import constraint_op

__all__ = [
    "mark_sharding",
    "annotate_custom_sharding",
    "clear_sharding",
    "get_sharding",
    "wrap_if_sharded",
    "wrap_as_sharded_tensor",
    "unwrap_sharded_tensor",
    "mark_sharding_with_gradients",
    "MarkShardingFunction",
    "shard_as",
    "ShardingSpec",
]


def checked(t: Any, mesh: Any, partition_spec: Any, caller: str) -> tuple[SpmdTensor, MeshSpec]:
    """The spmd tensor of a sharding call and its partition spec, checked and resolved
    against ``mesh``: the one place a user's spec becomes a :class:`MeshSpec`.

    >>> tensor, spec = checked(x, Mesh(range(8), (8,), ("x",)), ("x", None), "mark_sharding")
    >>> spec.axes
    ((0,), None)
    """
    tensor = state.as_spmd_tensor(t, caller)
    mesh = check_mesh(mesh, caller)
    return tensor, resolve(mesh, partition_spec, tensor.dim(), caller)


def mark_sharding(t: torch.Tensor | XLAShardedTensor, mesh: Mesh,
                  partition_spec: PartitionSpec) -> XLAShardedTensor:
    """Annotate ``t`` in place with ``partition_spec`` over ``mesh``; returns its wrapper.

    - a pending value gets a sharding constraint in the graph (no data moves);
    - host data is uploaded later, each device receiving only its shard;
    - device data is resharded device-to-device. If it already has a different,
      non-replicated sharding this raises ``RuntimeError`` (clear it first, or use
      ``annotate_custom_sharding``); the same sharding again is a no-op.

    Example::

        >>> x = torch.randn(8, 8).to("spmd")
        >>> xst = mark_sharding(x, Mesh(range(8), (2, 4)), (0, 1))
        >>> xst.sharding_spec
        '{devices=[2,4]0,1,2,3,4,5,6,7}'
    """
    tensor, spec = checked(t, mesh, partition_spec, "mark_sharding")
    return mark(t, tensor, spec, partition_spec)


def mark(t: torch.Tensor | XLAShardedTensor, tensor: SpmdTensor, spec: MeshSpec,
         partition_spec: PartitionSpec) -> XLAShardedTensor:
    """``mark_sharding`` once its arguments are ``checked``: ``tensor`` is ``t``'s spmd
    tensor, ``spec`` the resolved ``partition_spec`` (kept as given on the wrapper).

    >>> mark(x, *checked(x, mesh, (0, None), "mark_sharding"), (0, None))  # doctest: +SKIP
    """
    sharding = spec.named_sharding
    value = state.current_value(tensor)
    # While a compiled step is recorded, data is constrained in the graph rather than
    # resharded now: a reshard now would freeze this step's data into the program.
    if not value[0].is_leaf or is_recording():
        state.annotate(tensor, state.constrain(value, sharding))
    else:
        _mark_data(tensor, value, sharding, spec_to_hlo_text(spec))
    return wrap_as_sharded_tensor(t, spec.mesh.mesh_shape, partition_spec, mesh=spec.mesh)


def _mark_data(t: SpmdTensor, value: state.Value, sharding, text: str) -> None:
    """mark_sharding on host or device data (spec §4.2)."""
    existing = state.current_text(t)
    if existing == text and _same_devices(state.jax_sharding_of(value), sharding):
        return
    if existing not in ("", REPLICATED_TEXT):
        raise RuntimeError(
            f"Existing annotation must be cleared first: {existing} (requested {text}). "
            "Call clear_sharding(t) first, or reshard in the graph with "
            "annotate_custom_sharding(t, mesh, partition_spec).")
    state.replace_leaf(t, value, sharding)


def _same_devices(a, b) -> bool:
    """Whether shardings ``a`` and ``b`` span the same devices ('{replicated}' names none)."""
    return a is not None and a.device_set == b.device_set


def annotate_custom_sharding(t: torch.Tensor | XLAShardedTensor, mesh: Mesh,
                             partition_spec: PartitionSpec) -> XLAShardedTensor:
    """Constrain ``t``'s value to ``partition_spec`` inside the graph; moves no data now.

    Allowed on data that is already sharded (where ``mark_sharding`` refuses) and may
    be repeated with another spec. ``t`` becomes the constrained value, so after
    ``sync()`` it holds the annotated layout (spec §1.6).

    Example::

        >>> mark_sharding(w, mesh, ("fsdp", "tp"))
        >>> annotate_custom_sharding(w, mesh, (None, "tp"))   # all-gather over fsdp
        >>> y = x @ w
    """
    tensor, spec = checked(t, mesh, partition_spec, "annotate_custom_sharding")
    state.annotate(tensor, state.constrain(state.current_value(tensor), spec.named_sharding))
    return wrap_as_sharded_tensor(t, spec.mesh.mesh_shape, partition_spec, mesh=spec.mesh)


def clear_sharding(t: torch.Tensor | XLAShardedTensor) -> torch.Tensor:
    """Drop ``t``'s annotation (its spec becomes ``''``); returns the plain tensor.

    Every annotation goes (``mark_sharding``'s and ``annotate_custom_sharding``'s alike);
    device data stays where it is; a later ``mark_sharding`` with any spec is allowed.

    Example::

        >>> clear_sharding(xst)
        >>> get_sharding(x)
        ''
    """
    tensor = state.as_spmd_tensor(t, "clear_sharding")
    value = state.current_value(tensor)
    cleared = state.unannotated(value)
    if cleared[0].is_leaf and state.jax_sharding_of(cleared) is not None:
        cleared = state.plain_leaf(cleared)  # computed data: XLA's layout is not kept either
    if cleared != value:
        state.annotate(tensor, cleared)
    if isinstance(t, XLAShardedTensor):
        t.mesh_shape = t.partition_spec = t.mesh = None
        t.invalidate_spec_cache()
    return tensor


def get_sharding(t: torch.Tensor) -> str:
    """The V1 sharding text of ``t``'s current value (what ``sharding_spec`` shows).

    ``''`` for unannotated data and for pending values that are not constrained; after
    ``sync()`` computed values report the layout XLA gave them (spec §4.3).

    Example::

        >>> y = xst + 1
        >>> get_sharding(y)
        ''
        >>> torchspmd.sync(); get_sharding(y)
        '{devices=[1,8]0,1,2,3,4,5,6,7}'
    """
    inner = getattr(t, "global_tensor", t)
    if not isinstance(inner, SpmdTensor):
        return ""
    return state.current_text(inner)


def wrap_if_sharded(x: Any) -> Any:
    """``XLAShardedTensor(x)`` if ``x`` is an spmd tensor with a sharding, else ``x``.

    Example::

        >>> wrap_if_sharded(torch.ones(2))      # not an spmd tensor: unchanged
        tensor([1., 1.])
    """
    if (isinstance(x, SpmdTensor) and not isinstance(x, XLAShardedTensor)
            and get_sharding(x) != ""):
        return XLAShardedTensor(x)
    return x


def wrap_as_sharded_tensor(t: torch.Tensor | XLAShardedTensor, mesh_shape=None,
                           partition_spec=None, *, mesh: Mesh | None = None) -> XLAShardedTensor:
    """Wrap ``t`` in an ``XLAShardedTensor``, or update an existing wrapper's mesh/spec.

    Example::

        >>> xst = wrap_as_sharded_tensor(x, (2, 4), (0, 1))
        >>> xst.partition_spec
        (0, 1)
    """
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape, partition_spec, mesh=mesh)
    if mesh_shape is not None:
        t.mesh_shape = mesh_shape
    if partition_spec is not None:
        t.partition_spec = partition_spec
    if mesh is not None:
        t.mesh = mesh
    t.invalidate_spec_cache()
    return t


def unwrap_sharded_tensor(t: Any) -> Any:
    """The global tensor of an ``XLAShardedTensor``; anything else unchanged.

    Example::

        >>> unwrap_sharded_tensor(xst) is x
        True
    """
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


class MarkShardingFunction(torch.autograd.Function):
    """Autograd-aware mark_sharding: the output and the input's gradient get the spec.

    Works eagerly and under AOTAutograd (``functorch.compile.aot_function``): both
    directions are one traceable ``torchspmd::sharding_constraint`` op.

    Example::

        >>> y = MarkShardingFunction.apply(x, mesh, ("data", None))
    """

    @staticmethod
    def forward(ctx, t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> torch.Tensor:
        ctx.mesh, ctx.partition_spec = mesh, partition_spec
        return constraint_op(t, mesh, partition_spec)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return constraint_op(grad_output, ctx.mesh, ctx.partition_spec), None, None


def mark_sharding_with_gradients(t: torch.Tensor, mesh: Mesh,
                                 partition_spec: PartitionSpec) -> torch.Tensor:
    """A sharded copy of ``t`` whose gradient flows back with the same sharding.

    Not in place (unlike ``mark_sharding``): use the returned tensor.

    Example::

        >>> y = mark_sharding_with_gradients(x, mesh, (0, None))
        >>> y.sum().backward(); torchspmd.sync()
        >>> get_sharding(x.grad) == get_sharding(y)
        True
    """
    checked(t, mesh, partition_spec, "mark_sharding_with_gradients")
    return MarkShardingFunction.apply(t, mesh, partition_spec)


class _ShardAlike(torch.autograd.Function):
    """``(a, b)`` laid out alike, forward and backward (JAX ``shard_alike``)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor):
        return _shard_alike_values(state.as_spmd_tensor(a), state.as_spmd_tensor(b))

    @staticmethod
    def backward(ctx, grad_a, grad_b):
        if grad_a is None or grad_b is None:
            return grad_a, grad_b
        return _shard_alike_values(state.as_spmd_tensor(grad_a), state.as_spmd_tensor(grad_b))


def _shard_alike_values(a: SpmdTensor, b: SpmdTensor) -> tuple[SpmdTensor, SpmdTensor]:
    values = (a.handle.value(), b.handle.value())
    node = record(SHARD_ALIKE, (TENSOR, TENSOR), (), values, (a.handle.meta, b.handle.meta))
    return tuple(SpmdTensor(Handle.new((node, i), node.sig.outputs[i])) for i in range(2))


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """Give each pair of leaves of pytrees ``a`` and ``b`` the same sharding.

    Whichever of a pair has a sharding (annotated or propagated) lends it to the other
    (JAX ``shard_alike``). ``a`` and ``b`` must have the same structure, ``None`` where
    the other has ``None``. Returns new ``(a, b)``; the inputs are unchanged.

    Example::

        >>> mark_sharding(x, mesh, (0, None))
        >>> x2, y2 = shard_as(x, y)       # y2 is laid out like x
    """
    leaves_a, spec_a = tree_flatten(a)
    leaves_b, spec_b = tree_flatten(b)
    check(spec_a == spec_b, f"a and b must have the same structure: {spec_a} vs {spec_b}")
    pairs = [_shard_as_leaf(x, y) for x, y in zip(leaves_a, leaves_b)]
    return (tree_unflatten([p[0] for p in pairs], spec_a),
            tree_unflatten([p[1] for p in pairs], spec_b))


def _shard_as_leaf(x: Any, y: Any) -> tuple[Any, Any]:
    if x is None or y is None:
        check(x is None and y is None, "a and b must have None at the same places")
        return None, None
    return _ShardAlike.apply(x, y)


@dataclass
class ShardingSpec:
    """A mesh and a partition spec, applied to tensors later (PyTorch/XLA's ``ShardingSpec``).

    Example::

        >>> spec = ShardingSpec(mesh, ("data", None))
        >>> spec.can_apply(x) and spec.apply(x)
    """

    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: bool = False

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec fits ``t``'s rank."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> XLAShardedTensor:
        """``mark_sharding(t, mesh, partition_spec)``."""
        return mark_sharding(t, self.mesh, self.partition_spec)
