"""Registers ``torch.device("spmd")`` as a real PyTorch device backed by Python.

Only the allocation ops live on the PrivateUse1 key (they return the wrapper tensor);
every other op reaches ``SpmdTensor.__torch_dispatch__``.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch
import torch.optim.optimizer as torch_optimizer
from torch.utils import backend_registration

from torchspmd.device.dispatch import dispatch
from torchspmd.device.immediate import _copy_from, _local_scalar_dense
from torchspmd.device.resize import allocate_handle, contiguous_strides
from torchspmd.device.guard import DeviceGuard
from torchspmd.device.guard import install as install_backward_errors
from torchspmd.lowering import LOWERINGS
from torchspmd.device.tensor import SpmdTensor, check_device_index
from torchspmd.device import (accelerator, attention, autocast, checkpoint_fence, grad_scaler,
                              immediate, step_boundary, tied_parameters)
from torchspmd.jax_setup import devices
from torchspmd.lazy.node import TensorMeta
from torchspmd.runtime import rng
from torchspmd.runtime.in_flight import wait_device_ops

aten = torch.ops.aten


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    check_device_index(device)
    return _allocate(tuple(size), None, dtype)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    check_device_index(device)
    return _allocate(tuple(size), tuple(stride), dtype)


def _allocate(size, stride, dtype) -> SpmdTensor:
    """A fresh tensor; its (unspecified) contents are zeros, computed only if read."""
    stride = stride if stride is not None else contiguous_strides(size)
    meta = TensorMeta(size, stride, dtype or torch.get_default_dtype())
    return SpmdTensor(allocate_handle(meta), resizable=True)


def _pin_memory(self, device=None):
    """``aten::_pin_memory`` of a CPU tensor. Pinned (page-locked) host memory is a CUDA
    notion a Python backend cannot provide (``getPinnedMemoryAllocator`` has no Python
    hook), yet ``DataLoader(pin_memory=True)`` pins for the current accelerator, spmd:
    pinning for it is a plain copy (JAX uploads from ordinary host memory). Any other
    device pins as PyTorch does."""
    target = device if device is not None else torch.accelerator.current_accelerator()
    if target is not None and torch.device(target).type == "spmd":
        return self.clone(memory_format=torch.contiguous_format)
    return aten._pin_memory.default.redispatch(_COMPOSITE, self, device)


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _factory_ops() -> list:
    """Lowered ops that take no tensor and a ``device=``: ``arange``, ``randn``, ``triu_indices``...

    With no tensor argument there is no ``__torch_dispatch__`` to reach: PyTorch calls the
    device's kernel directly, so these are registered on PrivateUse1. Ops that decompose
    before reaching a backend (CompositeImplicitAutograd) are left to decompose.
    """
    ops = []
    for op in LOWERINGS:
        schema = getattr(op, "_schema", None)
        if schema is None or op._schema.name in ("aten::empty", "aten::empty_strided"):
            continue
        takes_device = any(a.name == "device" and a.kwarg_only for a in schema.arguments)
        takes_tensor = any("Tensor" in str(a.type) for a in schema.arguments)
        implicit = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        if takes_device and not takes_tensor and not implicit and not op._schema.is_mutable:
            ops.append(op)
    return ops


def _overload_suffix(op) -> str:
    return "" if op._overloadname == "default" else "." + op._overloadname


def _record_factory(op):
    def kernel(*args, **kwargs):
        check_device_index(kwargs.get("device"))
        return dispatch(op, args, kwargs)

    return kernel


class _Stream:
    """The spmd device's one stream. JAX runs device work in order, so there is nothing
    to order by hand; ``torch.distributed.checkpoint``'s writer asks for streams."""

    device_type = "spmd"

    def synchronize(self) -> None:
        wait_device_ops()

    def wait_stream(self, other) -> None:
        pass

    def query(self) -> bool:
        return True


_STREAM = _Stream()


def _device_module() -> types.ModuleType:
    """``torch.spmd``: what PyTorch asks of a device's module (seeding, counts)."""
    module = types.ModuleType("torch.spmd")
    module.is_available = lambda: True
    module.device_count = lambda: 1  # one virtual device spanning all physical devices
    module.current_device = lambda: 0
    module.synchronize = lambda device=None: wait_device_ops()
    module._is_in_bad_fork = lambda: False
    module.manual_seed = rng.manual_seed
    module.manual_seed_all = rng.manual_seed
    module.initial_seed = rng.initial_seed
    module.get_rng_state = lambda device=None: torch.tensor(rng.get_state(), dtype=torch.int64)
    module.set_rng_state = lambda state, device=None: rng.set_state(tuple(int(s) for s in state))
    module.is_initialized = lambda: True
    module.current_stream = lambda device=None: _STREAM
    module.stream = lambda stream=None: contextlib.nullcontext()
    # torch.autocast("spmd") and torch.utils.checkpoint (which saves the autocast state of
    # every device type it meets, CPU tensors included) ask the backend for these.
    module.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16, torch.float32]
    module.__getattr__ = _not_on_the_device
    return module


def _not_on_the_device(name: str):
    """What ``torch.spmd`` lacks (``Stream``, ``Event``, an allocator's calls) says why, and
    what to use in place of the per-process library that asked (FSDP2 asks for streams)."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torch.spmd has no attribute {name!r}: the spmd device has no streams, events or "
        "allocator of its own (XLA schedules and frees each program's work). Libraries that "
        "drive each process's device through them (torch.distributed.fsdp.fully_shard, "
        "DistributedDataParallel) do not run on it: shard with "
        "torchspmd.parallel.SpmdFullyShardedDataParallel (FSDPv2) or mark_sharding, which "
        "split one program over every device.")


def _no_tag(obj) -> None:
    """Saving never meets spmd storages: spmd tensors pickle as CPU copies."""
    return None


def _refuse_spmd_location(obj, location: str):
    """``torch.load(..., map_location="spmd")``: a clear error instead of PyTorch's
    ``AttributeError`` (it would move each storage to the device, and an spmd tensor's data
    lives in XLA buffers, not in a PyTorch storage)."""
    if location.split(":")[0] == "spmd":
        raise RuntimeError(
            "torchspmd: torch.load cannot map storages to the spmd device; load to the CPU "
            "(map_location='cpu', where torchspmd saves them) and move the result with "
            ".to('spmd'), or load it into a model on the device with "
            "model.load_state_dict(state)")
    return None


_LIBRARY = None  # keeps the kernel registrations alive


def register() -> None:
    """Make ``torch.device("spmd")`` usable (idempotent)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    # What _setup_privateuseone_for_python_backend does, less the rename done at import.
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("spmd", _device_module())
    torch.serialization.register_package(19, _no_tag, _refuse_spmd_location)
    torch._C._acc.register_python_privateuseone_hook(backend_registration._DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(DeviceGuard())
    install_backward_errors()
    tied_parameters.install()
    checkpoint_fence.install()
    autocast.install()
    grad_scaler.install()
    accelerator.install()
    attention.install()
    immediate.install()
    step_boundary.install()
    _LIBRARY = torch.library.Library("aten", "IMPL")
    _LIBRARY.impl("empty.memory_format", _empty, "PrivateUse1")
    _LIBRARY.impl("empty_strided", _empty_strided, "PrivateUse1")
    _LIBRARY.impl("_copy_from", _copy_from, "PrivateUse1")
    # A sparse, nested or quantized tensor on the device (``torch.sparse_coo_tensor(size,
    # device="spmd")``) reaches a dispatch key with no kernels: PyTorch's dispatcher
    # error named a "Sparsespmd backend".
    for key, kind in _OTHER_LAYOUTS.items():
        _OTHER_LAYOUT_KEYS.fallback(functools.partial(_refuse_layout, kind), key)
    # ``torch.tensor([loss, loss])`` reads each element in C++ with the Python key
    # excluded: it reaches the backend kernel, not __torch_dispatch__.
    _LIBRARY.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
    _LIBRARY.impl("_pin_memory", _pin_memory, "CPU")
    for op in _factory_ops():
        _LIBRARY.impl(op._schema.name.split("::")[-1] + _overload_suffix(op), _record_factory(op),
                      "PrivateUse1")
    # torch.optim picks its batched (foreach) update only for tensor types on its list;
    # one _foreach_* op per group records far fewer nodes than one op per parameter.
    foreach_types = torch_optimizer._foreach_supported_types
    if SpmdTensor not in foreach_types:
        foreach_types.append(SpmdTensor)


# Tensor kinds the spmd device does not hold, by the dispatch key they reach (``register``).
_OTHER_LAYOUTS = {"SparsePrivateUse1": "a sparse", "NestedTensorPrivateUse1": "a nested",
                  "QuantizedPrivateUse1": "a quantized"}
_OTHER_LAYOUT_KEYS = torch.library.Library("_", "IMPL")


def _refuse_layout(kind: str, op, *args, **kwargs):
    raise NotImplementedError(
        f"torchspmd: {op} was asked for {kind} tensor on the spmd device, which holds "
        "dense tensors only. Use dense ones (sparse: layout=torch.strided or t.to_dense(); "
        "nested: a padded tensor and a mask; quantized: a float dtype), or keep that "
        "tensor on the CPU.")


_ALIASES: dict[str, torch.library.Library] = {}  # dispatch key -> its registrations


def _one_device(kernel):
    """``kernel`` behind a check that the aliased device's index is 0 (or none)."""
    def checked(*args, **kwargs):
        index = torch.device(kwargs["device"]).index if kwargs.get("device") is not None else None
        if index not in (None, 0):
            raise RuntimeError(
                f"torchspmd: {kwargs['device']} names device {index}; there is one spmd device, "
                f"spmd:0, spanning every physical device. Use a Mesh to place work on some "
                f"of them.")
        return kernel(*args, **{**kwargs, "device": None})
    return checked


def register_device_alias(dispatch_key: str) -> None:
    """Make factories and copies that name another device type allocate spmd tensors.

    For ``"XLA"``: ``torch.zeros(3, device="xla")`` and ``t.to("xla:0")`` give tensors on
    ``spmd:0``. (A bare ``"xla"`` in ``torch.tensor(..., device=)`` or ``t.to()`` needs a
    device guard PyTorch keeps for its own backends; ``torchspmd.compat`` rewrites those.)

    Example::

        >>> register_device_alias("XLA")
        >>> torch.zeros(2, device="xla:0").device
        device(type='spmd', index=0)
    """
    register()
    if dispatch_key in _ALIASES:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _one_device(_empty), dispatch_key)
    library.impl("empty_strided", _one_device(_empty_strided), dispatch_key)
    library.impl("_copy_from", _copy_from, dispatch_key)
    for op in _factory_ops():
        library.impl(op._schema.name.split("::")[-1] + _overload_suffix(op),
                     _one_device(_record_factory(op)), dispatch_key)
    _ALIASES[dispatch_key] = library


def device() -> torch.device:
    """The spmd device: one virtual device spanning all physical devices.

    Example: ``x = torch.randn(4, 4, device=torchspmd.device())``.
    """
    return torch.device("spmd", 0)


def device_count() -> int:
    """The number of physical devices (8 CPU devices on a host with no accelerator)."""
    return len(devices())
