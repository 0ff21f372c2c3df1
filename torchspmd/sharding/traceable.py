"""Sharding constraints as a PyTorch custom op, so graph tracers can record them.

AOTAutograd (``functorch.compile.aot_function``) and other tracers run a function on fake
and functional tensors, which are not spmd tensors; they keep in their graph only ops that
go through PyTorch's dispatcher. ``torchspmd::sharding_constraint`` is such an op: traced,
it is an opaque node of the graph (its fake kernel gives the shape); run on spmd tensors,
it records the constraint. Its mesh and partition spec travel as text (``str(mesh)``,
``repr(spec)``), as PyTorch/XLA's dynamo op passes them.

Example::

    y = constraint_op(x, mesh, ("data", None))   # y: x laid out ("data", None)
"""

from __future__ import annotations

import ast
import functools

import torch

from torchspmd.device.dispatch import register_handler
from torchspmd.device.tensor import SpmdTensor
from torchspmd.sharding import state
from torchspmd.sharding.arguments import check_mesh, check_spec
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import PartitionSpec, resolve

__all__ = ["constraint_op"]


@torch.library.custom_op("torchspmd::sharding_constraint", mutates_args=())
def _sharding_constraint(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    # Reached only by tensors that are not spmd tensors (spmd ones go to _record below).
    raise RuntimeError(f"Expected XLA tensor (an spmd tensor). Got: {t.type()}. Move it to "
                       f"the device first: t.to('spmd').")


@_sharding_constraint.register_fake
def _(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    return torch.empty_like(t)


@functools.lru_cache(maxsize=256)
def _decoded(mesh: str, partition_spec: str):
    parsed = Mesh.from_str(mesh)
    if parsed is None:
        raise ValueError(f"torchspmd::sharding_constraint: cannot read the mesh {mesh!r}; "
                         f"pass str(mesh) of a torchspmd Mesh.")
    return resolve(parsed, ast.literal_eval(partition_spec)).named_sharding


def _record(t: SpmdTensor, mesh: str, partition_spec: str) -> SpmdTensor:
    return state.constrained_copy(t, _decoded(mesh, partition_spec))


register_handler(torch.ops.torchspmd.sharding_constraint.default, _record)


def constraint_op(t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> torch.Tensor:
    """A new tensor: ``t`` constrained to ``partition_spec`` over ``mesh`` (``t`` unchanged).

    Traceable: under AOTAutograd the graph keeps one ``torchspmd.sharding_constraint``
    node, which records the constraint when the compiled graph runs on spmd tensors.

    Example::

        >>> y = constraint_op(x, Mesh(range(8), (8,), ("x",)), ("x", None))
        >>> get_sharding(y)
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
    """
    check_mesh(mesh, "MarkShardingFunction")
    check_spec(partition_spec, t.dim(), "MarkShardingFunction")
    return torch.ops.torchspmd.sharding_constraint(t, str(mesh), repr(tuple(partition_spec)))
