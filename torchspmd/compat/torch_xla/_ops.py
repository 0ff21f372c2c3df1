"""``torch.ops.xla``: the ops PyTorch/XLA registers that users' code calls by name.

``xla::dynamo_mark_sharding`` (the traceable ``mark_sharding`` PyTorch/XLA's user guide
shows for activations) annotates an spmd tensor in place and returns it; other tensors
pass through untouched, as there. It decomposes before autograd, so gradients flow.
"""

from __future__ import annotations

import ast

import torch

from torchspmd.sharding import Mesh, mark_sharding

# The namespace's one library, as PyTorch/XLA's ``XLA_LIB``: kept for the process.
XLA_LIB = torch.library.Library("xla", "DEF")
XLA_LIB.define("dynamo_mark_sharding(Tensor input, int[] device_ids, int[] mesh_shape, "
               "str axis_names, str partition_spec) -> Tensor")


@torch.library.impl(XLA_LIB, "dynamo_mark_sharding", "CompositeImplicitAutograd")
def dynamo_mark_sharding(input: torch.Tensor, device_ids: list[int], mesh_shape: list[int],
                         axis_names: str, partition_spec: str) -> torch.Tensor:
    """``mark_sharding(input, Mesh(device_ids, mesh_shape, axis_names), partition_spec)``
    with the names and spec given as Python literals (``"('data', 'model')"``).

    Example::

        >>> torch.ops.xla.dynamo_mark_sharding(out, list(range(8)), [4, 2],
        ...                                    "('data', 'model')", "('data', None)")
    """
    if input.device.type != "spmd":
        return input
    mesh = Mesh(device_ids, tuple(mesh_shape), ast.literal_eval(axis_names))
    mark_sharding(input, mesh, ast.literal_eval(partition_spec))
    return input
