"""Checks of the arguments of the sharding API: each names the argument, what was
expected, and what to do instead (PyTorch/XLA's own messages where it has one).

Example::

    >>> check_mesh(None, "mark_sharding")
    TypeError: mark_sharding: mesh must be a torchspmd Mesh, got None. ...
"""

from __future__ import annotations

from typing import Any

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import check_spec  # re-exported: its callers check here

__all__ = ["spmd_tensor", "check_mesh", "check_spec"]


def spmd_tensor(t: Any, caller: str) -> SpmdTensor:
    """The spmd device tensor behind ``t`` (an ``XLAShardedTensor``'s global tensor).

    >>> spmd_tensor(torch.ones(2), "mark_sharding")  # doctest: +SKIP
    RuntimeError: Expected XLA tensor (an spmd tensor). Got: torch.FloatTensor
    """
    inner = getattr(t, "global_tensor", t)
    if isinstance(inner, SpmdTensor):
        return inner
    if isinstance(inner, torch.Tensor):  # PyTorch/XLA's message for a CPU tensor
        raise RuntimeError(f"Expected XLA tensor (an spmd tensor). Got: {inner.type()}. "
                           f"Move it to the device first: t.to('spmd').")
    raise TypeError(f"{caller}: expected a torch.Tensor on the spmd device, got "
                    f"{type(t).__module__}.{type(t).__qualname__}. Make it a tensor first: "
                    f"torch.as_tensor(x).to('spmd').")


def check_mesh(mesh: Any, caller: str) -> Mesh:
    """``mesh`` if it is a torchspmd ``Mesh``, else a ``TypeError`` saying how to get one.

    >>> check_mesh(Mesh([0, 1], (2,)), "mark_sharding").size()
    2
    """
    if isinstance(mesh, Mesh):
        return mesh
    hint = ("Build one with Mesh(device_ids, mesh_shape, axis_names), or pass "
            "get_global_mesh() after set_global_mesh(mesh).")
    if type(mesh).__module__.startswith("jax"):
        hint = ("A jax.sharding.Mesh is not accepted: build torchspmd's "
                "Mesh(device_ids, mesh_shape, axis_names) over the same device ids.")
    raise TypeError(f"{caller}: mesh must be a torchspmd Mesh, got "
                    f"{'None' if mesh is None else type(mesh).__qualname__}. {hint}")
