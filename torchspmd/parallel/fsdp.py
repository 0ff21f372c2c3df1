"""FSDPv2: fully sharded data parallelism written as sharding annotations (spec §1.12).

``SpmdFullyShardedDataParallel`` shards every parameter that has no sharding yet along
its largest dim over the mesh axis ``'fsdp'`` and shards the module's output batch the
same way; XLA's SPMD partitioner then inserts the all-gathers of the forward pass and
the reduce-scatters of the backward pass. Same arguments, defaults and error messages
as ``torch_xla.experimental.spmd_fully_sharded_data_parallel``. Example::

    mesh = Mesh(np.arange(8), (8, 1), ("fsdp", "model"))
    model = SpmdFullyShardedDataParallel(MyModel(), mesh=mesh)
    x = torch.randn(16, 128).to("spmd")
    mark_sharding(x, mesh, ("fsdp", None))
    model(x).sum().backward(); optimizer.step(); torchspmd.sync()
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchspmd.device.backend import device as spmd_device
from torchspmd.sharding.api import get_sharding, mark_sharding
from torchspmd.sharding.mesh import Mesh, get_global_mesh

__all__ = ["SpmdFullyShardedDataParallel", "apply_backward_optimization_barrier",
           "fsdp_partition_spec"]

ShardOutput = Callable[[Any, Mesh], None]


def fsdp_partition_spec(t: torch.Tensor, extra_data_axis: str | None = None,
                        shard_maximal: bool = False) -> tuple:
    """``'fsdp'`` (or ``(extra_data_axis, 'fsdp')``) on one dim of ``t``, ``None`` elsewhere.

    The dim is the largest one (the first of equals) with ``shard_maximal``, else dim 0
    (how a batch is split). Scalars get ``()`` (replicated).

    Example::

        >>> fsdp_partition_spec(torch.empty(64, 128), shard_maximal=True)
        (None, 'fsdp')
        >>> fsdp_partition_spec(torch.empty(16, 10), extra_data_axis="data")
        (('data', 'fsdp'), None)
    """
    shape = tuple(t.shape)
    if not shape:
        return ()
    index = shape.index(max(shape)) if shard_maximal else 0
    spec: list = [None] * len(shape)
    spec[index] = (extra_data_axis, "fsdp") if extra_data_axis else "fsdp"
    return tuple(spec)


def apply_backward_optimization_barrier(module: nn.Module) -> None:
    """Does nothing here; kept so PyTorch/XLA code that calls it runs unchanged.

    PyTorch/XLA puts an ``optimization_barrier`` on each module's gradients so that its
    compiler does not fuse the whole backward pass into a few huge fusions that keep every
    all-gathered weight alive. Here every step is one ``jax.jit`` program scheduled by
    XLA's own memory-aware scheduler, and the barrier would only constrain it; so none
    is inserted.

    Example::

        >>> apply_backward_optimization_barrier(nn.Linear(2, 2))
    """
    del module


def _has_own_forward(module: nn.Module) -> bool:
    forward = getattr(module, "forward", None)
    return getattr(forward, "__func__", None) not in (None, nn.Module.forward)


def _check_module(module: nn.Module) -> None:
    if isinstance(module, SpmdFullyShardedDataParallel):
        raise RuntimeError(
            "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, "
            "first wrap the inner child modules before wrapping the outer parent module.")
    if not _has_own_forward(module):
        raise RuntimeError(
            "The module wrapped by FSDP *must define a `forward` method and call it "
            "during the module's forward pass for FSDP to work correctly.* "
            "Hence, do not wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP "
            "(since they don't have `forward` defined), "
            "and do not perform the forward pass in other ways apart from the `forward` "
            "method. (i.e. you should directly call the FSDP-wrapped module itself in your "
            "code, instead of using any of its submodules or its weights).")


def _resolve_mesh(mesh: Mesh | None, extra_data_axis: str | None) -> Mesh:
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise ValueError("No mesh is provided and no global mesh is set. Please provide a mesh.")
    # An unnamed mesh raises TypeError here (``in None``), as in PyTorch/XLA.
    if "fsdp" not in mesh.axis_names:
        raise ValueError("The mesh must have an axis named 'fsdp'.")
    if extra_data_axis and extra_data_axis not in mesh.axis_names:
        raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
    return mesh


def _policy_says(policy: Callable, module: nn.Module, recurse: bool, numel: int) -> bool:
    """Call an auto-wrap policy with PyTorch/XLA's or PyTorch's name for the count."""
    params = inspect.signature(policy).parameters
    key = "nonwrapped_numel" if "nonwrapped_numel" in params else "unwrapped_params"
    return bool(policy(module=module, recurse=recurse, **{key: numel}))


def _recursive_wrap(module: nn.Module, policy: Callable, wrapper: Callable,
                    only_children: bool, **kwargs: Any) -> tuple[nn.Module, int]:
    """Wrap the submodules ``policy`` picks, bottom up (``torch_xla.distributed.fsdp.wrap``)."""
    numel = sum(p.numel() for p in module.parameters())
    if not _policy_says(policy, module, True, numel):
        return module, 0
    wrapped = 0
    for name, child in module.named_children():
        new_child, count = _recursive_wrap(child, policy, wrapper, False, **kwargs)
        setattr(module, name, new_child)
        wrapped += count
    if not only_children and _policy_says(policy, module, False, numel - wrapped):
        return wrapper(module, **kwargs), numel
    return module, wrapped


class SpmdFullyShardedDataParallel(nn.Module):
    """Shard ``module``'s unsharded parameters over the mesh axis ``'fsdp'`` (FSDPv2).

    Args:
      module: the module; moved to the spmd device. It must define ``forward``.
      mesh: a mesh with an axis named ``'fsdp'``; default the global mesh.
      shard_output: ``f(output, mesh)`` that annotates the forward's output. The default
        shards dim 0 of the output tensor (or of ``output[0]`` for a tuple, with a
        warning) over ``'fsdp'`` (``(extra_data_axis, 'fsdp')`` if given).
      auto_wrap_policy: wrap submodules first, as in FSDP: ``policy(module=, recurse=,
        unwrapped_params=)`` (or ``nonwrapped_numel=``, PyTorch's policies).
      auto_wrapper_callable: what wraps those submodules (default this class).
      extra_data_axis: a second mesh axis the batch is split over (multi-slice).

    Parameters that already have a sharding are left alone, so layers can be sharded
    by hand (e.g. tensor parallel) and the rest by this wrapper. Each parameter gets
    ``'fsdp'`` on its largest dim: ``Linear(128, 64).weight`` (64 x 128) gets
    ``(None, 'fsdp')``.

    Example::

        >>> set_global_mesh(Mesh(np.arange(8), (8,), ("fsdp",)))
        >>> model = SpmdFullyShardedDataParallel(nn.Linear(128, 64))
        >>> get_sharding(model.module.weight)
        '{devices=[1,8]0,1,2,3,4,5,6,7}'
    """

    def __init__(self, module: nn.Module, *, mesh: Mesh | None = None,
                 shard_output: ShardOutput | None = None,
                 auto_wrap_policy: Callable | None = None,
                 auto_wrapper_callable: Callable | None = None,
                 extra_data_axis: str | None = None):
        _check_module(module)
        mesh = _resolve_mesh(mesh, extra_data_axis)
        super().__init__()
        # The whole module moves first: a child wrapped below must not move on its own,
        # or a weight it shares with the rest (tied embeddings) would become two.
        # Module.to keeps ties on the spmd device (device/tied_parameters.py).
        module.to(spmd_device())
        if auto_wrap_policy is not None:
            self._auto_wrap(module, auto_wrap_policy,
                            auto_wrapper_callable or SpmdFullyShardedDataParallel,
                            mesh=mesh, shard_output=shard_output)
        self._orig_module = module
        self._mesh = mesh
        self._shard_parameters(module, mesh)
        apply_backward_optimization_barrier(module)
        self._shard_output = shard_output or _default_shard_output(extra_data_axis)

    @staticmethod
    def _shard_parameters(module: nn.Module, mesh: Mesh) -> None:
        for param in module.parameters():
            if get_sharding(param) != "":
                continue  # sharded by hand or by an inner wrapper
            mark_sharding(param, mesh, fsdp_partition_spec(param, shard_maximal=True))

    @staticmethod
    def _auto_wrap(module: nn.Module, policy: Callable, wrapper: Callable, **kwargs) -> None:
        for name, sub in module.named_modules():
            if isinstance(sub, SpmdFullyShardedDataParallel):
                raise ValueError(f"Expected {name} to NOT be SpmdFullyShardedDataParallel "
                                 "if using an `auto_wrap_policy`")
        # The root is wrapped by this instance itself, so only its children here.
        _recursive_wrap(module, policy, wrapper, only_children=True, **kwargs)

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``DistributedDataParallel.module``)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        # The output's batch sharding is what makes XLA choose FSDP's communication
        # (gather weights, keep activations batch-sharded) rather than another plan.
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str) -> Any:
        """Attributes the wrapper lacks are looked up on the wrapped module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_orig_module":  # not set yet (mid-construction, unpickling)
                raise
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Index the wrapped module (when it is an ``nn.Sequential``)."""
        return self.module.__getitem__(key)


def _default_shard_output(extra_data_axis: str | None) -> ShardOutput:
    def shard_output(output: Any, mesh: Mesh) -> None:
        real_output = None
        if isinstance(output, torch.Tensor):
            real_output = output
        elif isinstance(output, tuple):
            real_output = output[0] if isinstance(output[0], torch.Tensor) else None
            warnings.warn("The output is a tuple, but only the first element is sharded. If "
                          "this is not intended, please provide your own shard_output callable.")
        if real_output is None:
            raise RuntimeError(f"The output type is not supported: {type(output)}. Please "
                               "provide your own shard_output callable.")
        mark_sharding(real_output, mesh, fsdp_partition_spec(real_output, extra_data_axis))

    return shard_output
