"""DTensor placements <-> partition specs, and DeviceMesh -> torchspmd Mesh.

A DTensor placement list has one entry per *mesh* dim (``Shard(d)``: tensor dim ``d`` is
split over that mesh dim; ``Replicate()``: it is not); a partition spec has one entry per
*tensor* dim naming the mesh axes splitting it. ``Partial()`` (pending sums) has no
partition spec: GSPMD values are always complete, so it is refused.

Example::

    placements_to_spec([Replicate(), Shard(0)], ndim=2, axis_names=("dp", "tp"))
    # -> ("tp", None)
    spec_to_placements(("tp", None), axis_names=("dp", "tp"))
    # -> [Replicate(), Shard(0)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import spec_to_placements  # noqa: F401  (re-exported)

__all__ = ["placements_to_spec", "spec_to_placements", "convert_to_xla_mesh", "is_device_mesh"]


def placements_to_spec(placements: Sequence[Placement], ndim: int,
                       axis_names: Sequence[str | int]) -> tuple:
    """The partition spec of a tensor of rank ``ndim`` with these per-mesh-dim placements.

    ``axis_names[i]`` names mesh dim ``i`` in the spec (a name, or the index itself).
    Two mesh dims sharding one tensor dim give a tuple entry, major axis first.

    >>> placements_to_spec([Shard(1)], 2, ("tp",))
    (None, 'tp')
    """
    if len(placements) != len(axis_names):
        raise ValueError(f"torchspmd: {len(placements)} placements for a mesh of "
                         f"{len(axis_names)} dims; give one placement per mesh dim.")
    spec: list[Any] = [None] * ndim
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            dim = placement.dim + ndim if placement.dim < 0 else placement.dim
            if not 0 <= dim < ndim:
                raise ValueError(f"torchspmd: {placement} on a tensor of rank {ndim}.")
            axis = axis_names[mesh_dim]
            entry = spec[dim]
            spec[dim] = axis if entry is None else (*(entry if isinstance(entry, tuple)
                                                       else (entry,)), axis)
        elif not isinstance(placement, Replicate):
            raise NotImplementedError(
                f"torchspmd: placement {placement} is not supported: GSPMD values are never "
                "partial sums. Reduce first (redistribute to Replicate() or Shard(d)), or "
                "let XLA insert the reduction by annotating the result instead.")
    return tuple(spec)


def is_device_mesh(mesh: Any) -> bool:
    """Whether ``mesh`` is a ``torch.distributed.DeviceMesh``."""
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(mesh, DeviceMesh)


def convert_to_xla_mesh(dt_mesh: Any) -> Mesh:
    """The torchspmd :class:`Mesh` of a ``torch.distributed.DeviceMesh`` (PyTorch/XLA's name).

    The DeviceMesh's ranks are device ids, its dim names the axis names. A DeviceMesh
    sliced out of a larger one (``mesh["tp"]``) converts to its own 1-D mesh; pass the
    root mesh to keep the other axes.

    >>> convert_to_xla_mesh(init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp")))
    Mesh({'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (2, 4), 'axis_names': ('dp', 'tp')})
    """
    if not is_device_mesh(dt_mesh):
        raise TypeError(f"torchspmd: convert_to_xla_mesh needs a torch.distributed.DeviceMesh, "
                        f"got {type(dt_mesh).__name__}.")
    ranks = dt_mesh.mesh.cpu().numpy().astype(np.int64)
    return Mesh(ranks.flatten(), tuple(ranks.shape), dt_mesh.mesh_dim_names)
