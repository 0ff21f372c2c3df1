"""``parallelize_module``: PyTorch's tensor-parallel plans as GSPMD sharding annotations.

A plan written for DTensor (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``,
``PrepareModuleInput``, ``PrepareModuleOutput``; a torchtitan-style dict of module paths,
``*`` wildcards allowed) ports unchanged. Each style's attributes are read and become:

- parameters: ``mark_sharding`` over the tensor-parallel axis (``ColwiseParallel``: a
  Linear's weight and bias split by output features, an Embedding's by embedding dim;
  ``RowwiseParallel``: a Linear's weight by input features, an Embedding's by rows);
- activations: forward hooks put a sharding constraint on inputs (the *desired* layouts)
  and outputs (the *output* layouts). A ``Shard(d)`` layout splits dim ``d`` over the axis
  and leaves the other dims to XLA; ``Replicate()`` is a constraint only on a 1-D mesh (on
  a larger mesh "not split over this axis" leaves the other axes free, which is no
  constraint). Gradients get the same constraints (``with_sharding_constraint``'s
  transpose).

Values stay global tensors: ``use_local_output`` has nothing to do (a module sees the full
shapes, so code must not divide head counts by the TP degree itself; ``view(b, t, -1, hd)``
works as written). Sharding never changes values, so a plan only affects speed and memory.

Example::

    tp = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))["tp"]
    parallelize_module(block.to("spmd"), tp, {
        "attention.wq": ColwiseParallel(), "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()})
"""

from __future__ import annotations

import fnmatch
from typing import Any

import jax
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel)
from torch.distributed.tensor.parallel.style import ParallelStyle

from torchspmd.interop.call_jax import call_jax
from torchspmd.parallel.placements import convert_to_xla_mesh, is_device_mesh
from torchspmd.sharding.api import mark_sharding
from torchspmd.sharding.mesh import Mesh

__all__ = ["parallelize_module"]


def parallelize_module(module: nn.Module, device_mesh: Any,
                       parallelize_plan: ParallelStyle | dict[str, ParallelStyle],
                       *, tp_axis: str | None = None) -> nn.Module:
    """Apply a PyTorch tensor-parallel plan to ``module`` (on the spmd device); returns it.

    Args:
      module: the model, already moved to the spmd device.
      device_mesh: a ``DeviceMesh`` (a 1-D slice such as ``mesh["tp"]`` of a larger
        mesh shards over that axis of the whole mesh), or a torchspmd :class:`Mesh`.
      parallelize_plan: a style for ``module`` itself, or ``{path: style}`` with paths
        relative to ``module`` (``fnmatch`` wildcards per path component, as PyTorch).
      tp_axis: the mesh axis to shard over; needed for a torchspmd Mesh of several axes.

    Example::

        >>> parallelize_module(mlp, Mesh(range(8), (2, 4), ("dp", "tp")),
        ...                    {"up": ColwiseParallel(), "down": RowwiseParallel()}, tp_axis="tp")
    """
    mesh, axis = _mesh_and_axis(device_mesh, tp_axis)
    if isinstance(parallelize_plan, ParallelStyle):
        _apply(module, "", parallelize_plan, mesh, axis)
        return module
    if not isinstance(parallelize_plan, dict):
        raise TypeError("torchspmd: parallelize_plan must be a ParallelStyle or a dict of "
                        f"module path -> ParallelStyle, got {type(parallelize_plan).__name__}.")
    for pattern, style in parallelize_plan.items():
        matches = [(name, m) for name, m in module.named_modules()
                   if name and _matches(pattern, name)]
        if not matches:
            raise ValueError(f"torchspmd: parallelize_plan path {pattern!r} matches no submodule "
                             f"of {type(module).__name__}.")
        for name, submodule in matches:
            _apply(submodule, name, style, mesh, axis)
    return module


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatch(n, p) for p, n in zip(parts, names))


def _mesh_and_axis(device_mesh: Any, tp_axis: str | None) -> tuple[Mesh, str]:
    if is_device_mesh(device_mesh):
        root = device_mesh._get_root_mesh()
        if device_mesh.ndim != 1:
            raise ValueError("torchspmd: parallelize_module takes a 1-D DeviceMesh (the "
                             "tensor-parallel dim, e.g. mesh['tp']).")
        mesh = convert_to_xla_mesh(root)
        names = mesh.jax_axis_names()
        axis = device_mesh.mesh_dim_names[0] if device_mesh.mesh_dim_names else names[0]
        if tp_axis is not None and tp_axis != axis:
            raise ValueError(f"torchspmd: tp_axis {tp_axis!r} disagrees with the DeviceMesh's "
                             f"dim {axis!r}.")
        return mesh, axis
    if not isinstance(device_mesh, Mesh):
        raise TypeError("torchspmd: parallelize_module needs a DeviceMesh or a torchspmd Mesh, "
                        f"got {type(device_mesh).__name__}.")
    names = device_mesh.jax_axis_names()
    if tp_axis is None:
        if len(names) != 1:
            raise ValueError(f"torchspmd: mesh axes {names}: name the tensor-parallel one with "
                             "tp_axis=...")
        tp_axis = names[0]
    if tp_axis not in names:
        raise ValueError(f"torchspmd: tp_axis {tp_axis!r} is not an axis of the mesh {names}.")
    return device_mesh, tp_axis


# --- styles ----------------------------------------------------------------------------

def _apply(module: nn.Module, name: str, style: ParallelStyle, mesh: Mesh, axis: str) -> None:
    if isinstance(style, ColwiseParallel):
        _shard_params(module, name, style, mesh, axis, {nn.Linear: {"weight": 0, "bias": 0},
                                                         nn.Embedding: {"weight": 1}})
        desired = getattr(style, "desired_input_layouts", style.input_layouts)
        _constrain_inputs(module, desired, mesh, axis)
        _constrain_outputs(module, style.output_layouts, mesh, axis)
    elif isinstance(style, RowwiseParallel):
        _shard_params(module, name, style, mesh, axis, {nn.Linear: {"weight": 1},
                                                         nn.Embedding: {"weight": 0}})
        if isinstance(module, nn.Linear):  # the input's features are split, as the weight's
            _constrain_inputs(module, (Shard(-1),), mesh, axis)
        _constrain_outputs(module, style.output_layouts, mesh, axis)
    elif isinstance(style, SequenceParallel):
        _constrain_inputs(module, style.sequence_sharding, mesh, axis)
        _constrain_outputs(module, style.sequence_sharding, mesh, axis)
    elif isinstance(style, PrepareModuleInput):
        _constrain_inputs(module, style.desired_input_layouts, mesh, axis,
                          kwarg_layouts=style.desired_input_kwarg_layouts)
    elif isinstance(style, PrepareModuleOutput):
        _constrain_outputs(module, style.desired_output_layouts, mesh, axis)
    else:
        raise NotImplementedError(
            f"torchspmd: {type(style).__name__} (at {name or 'the root module'!r}) is not "
            "supported; use ColwiseParallel, RowwiseParallel, SequenceParallel, "
            "PrepareModuleInput or PrepareModuleOutput, or mark_sharding directly.")


def _shard_params(module: nn.Module, name: str, style: ParallelStyle, mesh: Mesh, axis: str,
                  dims_by_type: dict) -> None:
    for kind, dims in dims_by_type.items():
        if isinstance(module, kind):
            for param, dim in dims.items():
                tensor = getattr(module, param)
                if tensor is not None:
                    spec = [None] * tensor.dim()
                    # an unnamed mesh (a DeviceMesh without dim names) takes axis indices
                    spec[dim] = axis if mesh.axis_names else mesh.jax_axis_names().index(axis)
                    mark_sharding(tensor, mesh, tuple(spec))
            return
    raise NotImplementedError(
        f"torchspmd: {type(style).__name__} applies to nn.Linear and nn.Embedding; "
        f"{name or 'the root module'!r} is a {type(module).__name__}. Mark its parameters "
        "with mark_sharding instead.")


def _as_tuple(layouts) -> tuple:
    if layouts is None:
        return ()
    return tuple(layouts) if isinstance(layouts, (tuple, list)) else (layouts,)


def _constrain_inputs(module: nn.Module, layouts, mesh: Mesh, axis: str,
                      kwarg_layouts: dict | None = None) -> None:
    layouts = _as_tuple(layouts)
    kwarg_layouts = kwarg_layouts or {}

    def hook(_, args, kwargs):
        args = tuple(constrain(a, layout, mesh, axis) if layout is not None else a
                     for a, layout in zip(args, layouts)) + tuple(args[len(layouts):])
        kwargs = {k: constrain(v, kwarg_layouts[k], mesh, axis) if k in kwarg_layouts else v
                  for k, v in kwargs.items()}
        return args, kwargs

    module.register_forward_pre_hook(hook, with_kwargs=True)


def _constrain_outputs(module: nn.Module, layouts, mesh: Mesh, axis: str) -> None:
    layouts = _as_tuple(layouts)

    def hook(_, args, output):
        if isinstance(output, torch.Tensor):
            return constrain(output, layouts[0], mesh, axis)
        return type(output)(constrain(o, layout, mesh, axis) if layout is not None else o
                            for o, layout in zip(output, layouts + (None,) * len(output)))

    module.register_forward_hook(hook)


def constrain(t: Any, layout, mesh: Mesh, axis: str) -> Any:
    """``t`` laid out by DTensor placement ``layout`` on mesh axis ``axis`` (gradients too).

    Non-tensors, and tensors off the spmd device (a model moved back to the CPU), pass
    through. Example: ``constrain(x, Shard(1), mesh, "tp")``.
    """
    if not isinstance(t, torch.Tensor) or t.device.type != "spmd":
        return t
    if isinstance(layout, Replicate) and len(mesh.mesh_shape) > 1:
        return t  # "not over this axis" leaves the others free: no constraint to give
    sharding = NamedSharding(mesh.get_jax_mesh(), _spec(layout, t.dim(), axis, mesh))
    return call_jax(_with_constraint, t, sharding=sharding)


def _spec(layout, ndim: int, axis: str, mesh: Mesh) -> P:
    free = P.UNCONSTRAINED if len(mesh.mesh_shape) > 1 else None
    if isinstance(layout, Replicate):
        return P(*[None] * ndim)
    if isinstance(layout, Shard):
        dim = layout.dim + ndim if layout.dim < 0 else layout.dim
        return P(*[axis if i == dim else free for i in range(ndim)])
    raise NotImplementedError(f"torchspmd: layout {layout} is not supported in a plan: GSPMD "
                              "values are never partial sums; use Replicate() or Shard(d).")


def _with_constraint(x: jax.Array, *, sharding: NamedSharding) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, sharding)
