"""Manual sharding: between enable and disable, ops see each device's local block.

``enable_manual_sharding`` marks a tensor and hands back its local block (shape divided
by the tiling); the ops that follow are written per device, as in ``jax.shard_map``;
``disable_manual_sharding`` reassembles the global tensor. The compiled program runs the
ops in between as one ``shard_map`` body.
"""

from __future__ import annotations

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TENSOR
from torchspmd.lazy.record import meta_of, record
from torchspmd.lowering.annotation_ops import FULL_TO_SHARD, SHARD_TO_FULL
from torchspmd.runtime.manual_regions import note_entry
from torchspmd.sharding import state
from torchspmd.sharding.api import checked, mark, wrap_as_sharded_tensor
from torchspmd.sharding.mesh import Mesh, get_global_mesh
from torchspmd.sharding.arguments import check_mesh
from torchspmd.sharding.partition_spec import PartitionSpec, resolve
from torchspmd.sharding.sharded_tensor import XLAShardedTensor

__all__ = ["enable_manual_sharding", "disable_manual_sharding", "_mark_manual_sharding"]


def _mesh_or_global(mesh: Mesh | None, caller: str) -> Mesh:
    mesh = mesh if mesh is not None else get_global_mesh()
    if mesh is None:
        raise ValueError("No mesh is provided and no global mesh is set. Pass mesh= or call "
                         "set_global_mesh(mesh).")
    return check_mesh(mesh, caller)


def _region_entry(value):
    """The ``full_to_shard`` node a local block ``value`` was computed from, or None."""
    seen, stack = set(), [value[0]]
    while stack:
        node = stack.pop()
        if node in seen or node.is_leaf:
            continue
        seen.add(node)
        if node.sig.op is FULL_TO_SHARD:
            return node
        stack.extend(n for n, _ in node.inputs)
    return None


def _reshaped(value, sharding, op, shape) -> SpmdTensor:
    template = (TENSOR, sharding, tuple(shape))
    node = record(op, template, (), (value,), (meta_of(value),))
    if op is FULL_TO_SHARD:
        note_entry(node)
    return SpmdTensor(Handle.new((node, 0), node.sig.outputs[0]))


def enable_manual_sharding(t: torch.Tensor, partition_spec: PartitionSpec, *,
                           mesh: Mesh | None = None) -> XLAShardedTensor:
    """Shard ``t`` by ``partition_spec`` and return each device's local block, ``{manual}``.

    Example::

        >>> mesh = Mesh(range(8), (1, 8))
        >>> local = enable_manual_sharding(x, (0, 1), mesh=mesh)   # x: (8, 8)
        >>> local.shape
        torch.Size([8, 1])
    """
    mesh = _mesh_or_global(mesh, "enable_manual_sharding")
    inner, spec = checked(t, mesh, partition_spec, "mark_sharding")  # mark_sharding's messages
    mark(t, inner, spec, partition_spec)
    sharding = spec.named_sharding
    try:
        local_shape = sharding.shard_shape(tuple(inner.shape))
    except ValueError as e:
        raise ValueError(f"torchspmd: enable_manual_sharding needs dims that divide evenly "
                         f"by the tiling; shape {tuple(inner.shape)} with spec "
                         f"{partition_spec} does not.") from e
    local = _reshaped(inner.handle.value(), sharding, FULL_TO_SHARD, local_shape)
    return wrap_as_sharded_tensor(local)


def disable_manual_sharding(t: torch.Tensor, partition_spec: PartitionSpec,
                            full_shape: tuple[int, ...], *,
                            mesh: Mesh | None = None) -> XLAShardedTensor:
    """Reassemble the global tensor of shape ``full_shape`` from local blocks ``t``.

    Example::

        >>> y = disable_manual_sharding(local * 2, (0, 1), (8, 8), mesh=mesh)
        >>> torch.equal(y.cpu(), x.cpu() * 2)
        True

    The spec may differ from ``enable_manual_sharding``'s, as in PyTorch/XLA (whose
    ``_spmd_shard_to_full_shape`` takes the spec it is given) and as ``shard_map``'s
    out_specs may differ from its in_specs: the block at each mesh position becomes the
    tile at that position under ``partition_spec``. So blocks cut along dim 0 can be
    laid side by side along dim 1::

        >>> local = enable_manual_sharding(x, ("a", None), mesh=mesh)   # x: (16, 4), 8 devices
        >>> y = disable_manual_sharding(local, (None, "a"), (2, 32), mesh=mesh)
        >>> torch.equal(y.cpu(), torch.cat(x.cpu().split(2), dim=1))
        True

    The mesh must be the region's, and ``t``'s shape must be ``full_shape`` divided by the
    spec's tiling; otherwise this raises.
    """
    mesh = _mesh_or_global(mesh, "disable_manual_sharding")
    inner = state.as_spmd_tensor(t, "disable_manual_sharding")
    full_shape = tuple(int(d) for d in full_shape)
    sharding = resolve(mesh, partition_spec, len(full_shape),
                       "disable_manual_sharding").named_sharding
    value = inner.handle.value()
    entry = _region_entry(value)
    if entry is None:
        raise RuntimeError("disable_manual_sharding: the tensor is not manual sharded (not a "
                           "local block computed from enable_manual_sharding's result)")
    if entry.sig.template[1].mesh != sharding.mesh:
        raise ValueError("disable_manual_sharding: mesh must be the one the region was "
                         "entered with (enable_manual_sharding's mesh)")
    try:
        local = sharding.shard_shape(full_shape)
    except ValueError:
        local = None
    if local != tuple(inner.shape):
        raise ValueError(
            f"disable_manual_sharding: local blocks of shape {tuple(inner.shape)} do not make a "
            f"{full_shape} tensor under spec {tuple(partition_spec)}: each block would be "
            f"{local if local is not None else 'uneven'}. Pass the spec and full shape the "
            f"blocks were cut with (usually enable_manual_sharding's).")
    return wrap_as_sharded_tensor(_reshaped(value, sharding, SHARD_TO_FULL, full_shape))


def _mark_manual_sharding(t: torch.Tensor, *, mesh: Mesh | None = None) -> XLAShardedTensor:
    """PyTorch/XLA's low-level manual marker: ``t``'s pending value becomes a local block.

    - a value computed from local blocks (inside a manual region) already is one: it is
      returned as it is, reported ``{manual}``;
    - any other pending value enters a manual region over ``mesh`` (default: the global
      mesh) in which every device's block is its copy of the whole value, as XLA reads a
      ``{manual}`` annotation on a replicated value; ``disable_manual_sharding`` then
      assembles the global tensor from those blocks;
    - device or host data raises, as in PyTorch/XLA.

    Example::

        >>> local = _mark_manual_sharding(x * 1, mesh=Mesh(range(8), (8,), ("x",)))
        >>> local.sharding_spec
        '{manual}'
        >>> y = disable_manual_sharding(local, ("x",), (8 * x.shape[0],), mesh=mesh)  # 8 copies
    """
    inner = state.as_spmd_tensor(t, "_mark_manual_sharding")
    value = inner.handle.value()
    if value[0].is_leaf:
        raise RuntimeError("Marking any data tensors as manual is not supported")
    if state.in_manual_region(value):
        return wrap_as_sharded_tensor(inner)
    mesh = _mesh_or_global(mesh, "_mark_manual_sharding")
    whole = resolve(mesh, (None,) * inner.dim()).named_sharding
    return wrap_as_sharded_tensor(_reshaped(value, whole, FULL_TO_SHARD, tuple(inner.shape)))
