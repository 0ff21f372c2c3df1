"""PyTorch/XLA's DTensor-style entry points: ``xla_distribute_module``, ``xla_distribute_tensor``.

``xla_distribute_module`` shards a module's parameters and inputs with user functions;
``xla_distribute_tensor`` places one tensor by DTensor placements over a DeviceMesh.

PyTorch/XLA's DTensor-style entry point (spec §1.10): ``partition_fn(name, submodule,
mesh)`` runs for every ``named_modules()`` entry (typically calling ``mark_sharding`` on
its parameters); ``input_fn(module, inputs, mesh)`` and ``output_fn(module, outputs,
mesh)`` become forward pre/post hooks. Parameters no function touches stay replicated.
Example::

    def partition_fn(name, module, mesh):
        if isinstance(module, nn.Linear):
            mark_sharding(module.weight, mesh, ("model", None))

    model = xla_distribute_module(model.to("spmd"), mesh, partition_fn)
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel.style import ParallelStyle

from torchspmd.parallel.placements import convert_to_xla_mesh, is_device_mesh, placements_to_spec
from torchspmd.parallel.plans import parallelize_module
from torchspmd.sharding.api import mark_sharding
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.sharded_tensor import XLAShardedTensor

__all__ = ["auto_policy", "xla_distribute_module", "xla_distribute_tensor"]


def auto_policy(name: str, module: nn.Module, device_mesh: Any) -> None:
    """PyTorch/XLA's auto-sharding ``partition_fn``: not supported by torchspmd.

    PyTorch/XLA hands the whole program to XLA's auto-sharding pass (TPU only). JAX does
    not expose that pass; shard parameters with ``mark_sharding`` (or FSDPv2) instead.

    Example::

        >>> xla_distribute_module(model, mesh, auto_policy)   # doctest: +SKIP
        NotImplementedError: torchspmd: auto_policy (XLA auto-sharding) is not supported ...
    """
    raise NotImplementedError(_AUTO_POLICY_MESSAGE)


_AUTO_POLICY_MESSAGE = (
    "torchspmd: auto_policy (XLA auto-sharding) is not supported: JAX does not expose XLA's "
    "auto-sharding pass. Pass a partition_fn that calls mark_sharding on the parameters, or "
    "wrap the model in torchspmd.parallel.SpmdFullyShardedDataParallel.")


def _arg_count(fn: Callable) -> int:
    return len(inspect.signature(fn).parameters)


def _install_input_fn(module: nn.Module, input_fn: Callable, mesh: Any) -> None:
    count = _arg_count(input_fn)
    if count == 2:
        warnings.warn("Deprecating input_fn that takes two arguments (inputs, device_mesh), "
                      "please use input_fn that takes in (module, inputs, device_mesh) instead!")
        module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, mesh))
    elif count == 3:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, mesh))
    else:
        raise ValueError(f"input_fn should take in 3 arguments, but got {count} arguments!")


def _install_output_fn(module: nn.Module, output_fn: Callable, mesh: Any) -> None:
    count = _arg_count(output_fn)
    if count == 2:
        warnings.warn("Deprecating output_fn that takes two arguments (inputs, device_mesh), "
                      "please use output_fn that takes in (module, inputs, device_mesh) instead!")
        module.register_forward_hook(lambda _, inputs, outputs: output_fn(outputs, mesh))
    elif count == 3:
        module.register_forward_hook(
            lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
    else:
        raise ValueError(f"output_fn should take in 3 arguments, but got {count} arguments!")


def xla_distribute_module(module: nn.Module, device_mesh: Mesh | None = None,
                          partition_fn: Callable[[str, nn.Module, Any], None] | None = None,
                          input_fn: Callable[..., Any] | None = None,
                          output_fn: Callable[..., Any] | None = None) -> nn.Module:
    """Partition ``module`` with ``partition_fn`` and install input/output hooks; returns it.

    Args:
      module: the module, already on the spmd device (``partition_fn`` marks its tensors).
      device_mesh: passed to the three functions as is (a ``torchspmd.sharding.Mesh``).
      partition_fn: ``(name, submodule, mesh)``, called for every ``named_modules()``
        entry, the root (``''``) first. ``auto_policy`` raises NotImplementedError. A
        method of a PyTorch ``ParallelStyle`` (PyTorch's ``parallelize_module`` passes one
        for a ``DeviceMesh("xla", ...)``) applies that style instead, as
        :func:`torchspmd.parallel.parallelize_module` does.
      input_fn: ``(module, inputs, mesh)``, a forward pre-hook: what it returns (if not
        ``None``) replaces the positional inputs tuple.
      output_fn: ``(module, outputs, mesh)``, a forward hook: what it returns (if not
        ``None``) replaces the output. The two-argument forms ``(inputs, mesh)`` /
        ``(outputs, mesh)`` still work, with a deprecation warning.

    Example::

        >>> def shard_batch(module, inputs, mesh):
        ...     mark_sharding(inputs[0], mesh, ("data", None))
        >>> model = xla_distribute_module(model, mesh, input_fn=shard_batch)
    """
    style = getattr(partition_fn, "__self__", None)
    if isinstance(style, ParallelStyle):
        # PyTorch's own parallelize_module, given a DeviceMesh("xla", ...), comes here with
        # its style's functions, which make DTensors (PyTorch/XLA fails in them): the
        # style is applied as torchspmd.parallel.parallelize_module applies it.
        return parallelize_module(module, device_mesh, style)
    if partition_fn is not None:
        if getattr(partition_fn, "__name__", None) == "auto_policy":
            raise NotImplementedError(_AUTO_POLICY_MESSAGE)
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, device_mesh)
    if input_fn is not None:
        _install_input_fn(module, input_fn, device_mesh)
    if output_fn is not None:
        _install_output_fn(module, output_fn, device_mesh)
    return module


def xla_distribute_tensor(tensor: torch.Tensor, device_mesh: Any,
                          placements: Any = None) -> XLAShardedTensor:
    """``tensor`` on the spmd device, sharded by DTensor ``placements`` over ``device_mesh``.

    PyTorch/XLA's function: ``device_mesh`` is a ``torch.distributed.DeviceMesh`` (or a
    torchspmd :class:`Mesh`), ``placements`` one ``Shard(d)``/``Replicate()`` per mesh dim
    (default: all ``Replicate()``). ``Partial()`` raises ``NotImplementedError``. A CPU
    tensor is moved to the spmd device first. Returns the ``XLAShardedTensor``.

    Example::

        >>> mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> xt = xla_distribute_tensor(torch.randn(8, 16), mesh, [Shard(0), Shard(1)])
        >>> xt.sharding_spec
        '{devices=[2,4]0,1,2,3,4,5,6,7}'
    """
    mesh = convert_to_xla_mesh(device_mesh) if is_device_mesh(device_mesh) else device_mesh
    if not isinstance(mesh, Mesh):
        raise TypeError(f"torchspmd: xla_distribute_tensor needs a DeviceMesh or a Mesh, got "
                        f"{type(device_mesh).__name__}.")
    ndim = len(mesh.mesh_shape)
    placements = list(placements) if placements is not None else [None] * ndim
    placements = [Replicate() if p is None else p for p in placements]
    spec = placements_to_spec(placements, tensor.dim(), range(ndim))
    if tensor.device.type != "spmd":
        tensor = tensor.to("spmd")
    return mark_sharding(tensor, mesh, spec)
