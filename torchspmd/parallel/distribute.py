"""``xla_distribute_module``: shard a module's parameters and inputs with user functions.

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

from torch import nn

from torchspmd.sharding.mesh import Mesh

__all__ = ["auto_policy", "xla_distribute_module"]


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
        entry, the root (``''``) first. ``auto_policy`` raises NotImplementedError.
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
