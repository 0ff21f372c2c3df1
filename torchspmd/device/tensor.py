"""The spmd device tensor: a wrapper subclass holding a lazy :class:`Handle`.

Every op on it reaches ``__torch_dispatch__`` (``dispatch.py``); autograd, ``nn.Parameter``
and ``Module.to`` work above it as on any device.
"""

from __future__ import annotations

import copy
import math

import torch

from torchspmd.device.host import to_cpu
from torchspmd.lazy import provenance, views
from torchspmd.lazy.handle import Handle

DEVICE = torch.device("spmd", 0)
RESIZABLE_BYTES = 1 << 50
_MAKE = torch.Tensor._make_wrapper_subclass


def check_device_index(device) -> None:
    """Refuse ``spmd:N`` for N != 0: there is one spmd device, spanning every physical one.

    >>> check_device_index("spmd:3")  # doctest: +SKIP
    RuntimeError: torchspmd: there is one spmd device, spmd:0 ...
    """
    if device is None:
        return
    if type(device) is not torch.device:  # every x.to(device) allocates through here
        device = torch.device(device)
    if device.type == DEVICE.type and device.index not in (None, 0):
        from torchspmd.jax_setup import devices  # the physical devices (for the message)

        raise RuntimeError(
            f"torchspmd: there is one spmd device, spmd:0, and it spans all "
            f"{len(devices())} physical devices; got {device}. Use torch.device('spmd') and "
            f"choose physical devices with a Mesh and mark_sharding(t, mesh, spec).")


_NO_DLPACK = (
    "torchspmd: an spmd tensor cannot be shared through DLPack: its data is a JAX array "
    "laid out over the mesh's devices, with no single buffer to point at. To run JAX code "
    "on it use torchspmd.call_jax(fn, t); to read it, t.cpu().")


def _nbytes(storage) -> int:
    """The size of a lazy storage's data, in bytes."""
    meta = storage.meta
    return math.prod(meta.shape) * meta.dtype.itemsize


class StorageKey(torch.UntypedStorage):
    """What ``t.untyped_storage()`` is for an spmd tensor: the data lives on the devices, so
    there is nothing to point at on the host, but ``data_ptr()`` is the same number for
    every tensor and view over one storage and differs between storages that are alive,
    and ``nbytes()`` is the storage's size. Libraries that group a state dict's tensors by
    storage read these two (Hugging Face's ``save_pretrained`` and safetensors find tied
    weights so); PyTorch's own storage of the tensor (a placeholder without data) raised
    "invalid python storage" there.

    The number is an address in a host-side address space no storage shares: each
    storage asked for one gets the next ``nbytes`` of it (never reused), so
    ``t.data_ptr()``, the storage's address plus the view's offset, is as on CPU: equal
    for tensors over the same data, different (and non-overlapping ranges) otherwise.

    >>> a = torch.ones(4, device="spmd")  # doctest: +SKIP
    >>> a.untyped_storage().data_ptr() == a[1:].untyped_storage().data_ptr()  # doctest: +SKIP
    True
    """

    # The next free address (a registry of one number: addresses are never reused).
    _next_address = 1 << 32

    @classmethod
    def address(cls, storage) -> int:
        """``storage``'s address, given at its first use."""
        address = getattr(storage, "address", None)
        if address is None:
            address = storage.address = cls._next_address
            cls._next_address += -(-_nbytes(storage) // 256) * 256 + 256  # aligned, a gap
        return address

    def __new__(cls, key: int, nbytes: int):
        storage = super().__new__(cls, 0, device="meta")
        storage.key, storage.size_in_bytes = key, nbytes
        return storage

    def data_ptr(self) -> int:
        return self.key

    def nbytes(self) -> int:
        return self.size_in_bytes

    def size(self) -> int:
        return self.size_in_bytes


class SpmdTensor(torch.Tensor):
    """A tensor on ``torch.device("spmd", 0)``; its value is a lazy graph value or device data.

    Example::

        >>> x = torch.ones(2, device="spmd") * 3   # recorded, not run
        >>> x.cpu()                                  # runs the graph
        tensor([3., 3.])
    """

    _h: Handle

    @staticmethod
    def __new__(cls, handle: Handle, requires_grad: bool = False, resizable: bool = False):
        meta = handle.meta
        # The wrapper's storage holds no data; a resizable one (from ``empty``, which
        # ``out=`` ops may resize) claims room for any size so as_strided_ can grow it.
        if resizable:
            t = _MAKE(cls, meta.shape, strides=meta.stride, dtype=meta.dtype, device=DEVICE,
                      requires_grad=requires_grad, storage_size=RESIZABLE_BYTES)
        else:  # every op's result: no keyword dict to build and unpack
            t = _MAKE(cls, meta.shape, strides=meta.stride, dtype=meta.dtype, device=DEVICE,
                      requires_grad=requires_grad)
        t._h = handle
        return t

    @property
    def handle(self) -> Handle:
        """The lazy :class:`Handle` behind this tensor: the public way for the layers above
        ``device/`` (``step/``, ``sharding/``, ``interop/``...) to reach it, instead of ``_h``.

        >>> torch.ones(2, device="spmd").handle.meta.shape  # doctest: +SKIP
        torch.Size([2])
        """
        return self._h

    @property
    def data(self) -> torch.Tensor:
        """``t.data``: a detached tensor sharing ``t``'s storage (as PyTorch's)."""
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """``t.data = new``: ``t`` shares ``new``'s storage from now on (as PyTorch's), keeping
        its identity and autograd flags. ``Module.to(dtype)``, ``.half()`` and friends do
        this to every parameter. PyTorch's own setter copies only the C++ metadata (shape,
        dtype); the value lives in this Python object's handle, so it is set here too."""
        if not isinstance(new, SpmdTensor):
            raise RuntimeError(
                f"torchspmd: t.data = x needs x on the spmd device too (so does t.set_(x)), "
                f"got a tensor on {new.device}: use x.to('spmd') (the data then lives on the "
                "devices)")
        if provenance.is_recording():
            # A replay writes new values into the storages a step read; one whose tensor
            # moved to another storage mid-step has nowhere to go.
            raise RuntimeError(
                "torchspmd.compile: t.data = x (or t.set_(x)) inside a compiled step is not "
                "supported: write the new value in place instead (with torch.no_grad(): "
                "t.copy_(x)), or assign .data outside the step")
        torch.Tensor.data.__set__(self, new)
        self._h = new.detach()._h

    def __copy__(self):
        """``copy.copy(t)``: a tensor sharing ``t``'s storage, as for PyTorch's tensors
        (through pickling, it came back as a CPU copy)."""
        return self._with_attributes(self.detach().requires_grad_(self.requires_grad),
                                     lambda value: value)

    def untyped_storage(self) -> torch.UntypedStorage:
        """A :class:`StorageKey` for this tensor's storage: no data on the host, but the
        identity libraries group tensors by (see there)."""
        storage = self._h.storage
        return StorageKey(StorageKey.address(storage), _nbytes(storage))

    def storage_offset(self) -> int:
        """Where this view starts in its storage, in elements (0 for a base)."""
        handle = self._h
        return views.storage_offset(handle.storage.meta, handle.view)

    def data_ptr(self) -> int:
        """A number standing for the address of this tensor's first element, as on CPU:
        the same for tensors over the same data, different otherwise (``StorageKey``)."""
        return (StorageKey.address(self._h.storage)
                + self.storage_offset() * self.dtype.itemsize)

    # Results are made by __torch_dispatch__ already; skip __torch_function__ entirely.
    __torch_function__ = torch._C._disabled_torch_function_impl

    # Set by dispatch.py (which imports this module) to its ``dispatch`` function.
    _dispatch = None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls._dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None) -> str:
        text = torch._tensor_str._str(to_cpu(self))
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def __format__(self, format_spec: str) -> str:
        # torch.Tensor formats a 0-d tensor as its number only when its type is exactly
        # Tensor: ``f"{loss:.4f}"`` on a subclass would raise where a CUDA loss prints
        # (and ``f"{loss}"`` would print the repr where CPU prints the number).
        if self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def tolist(self):
        return to_cpu(self).tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")

    def __dlpack__(self, *args, **kwargs):
        raise TypeError(_NO_DLPACK)

    def __dlpack_device__(self):
        raise TypeError(_NO_DLPACK)

    def __reduce_ex__(self, protocol):
        # torch.save and pickle store a CPU copy, as the issue asks.
        return to_cpu(self).detach().requires_grad_(self.requires_grad).__reduce_ex__(protocol)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """AOTAutograd's check of a gradient's type: spmd tensors are this device's plain
        tensors (not traceable subclasses), so one stands for an expected ``torch.Tensor``."""
        if expected_metadata is None and expected_type in (None, torch.Tensor):
            return self
        return None

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = self.detach().clone().requires_grad_(self.requires_grad)
        memo[id(self)] = result
        if self.grad is not None and not getattr(self, "_is_param", False):
            # torch.Tensor's deepcopy keeps the gradient; nn.Parameter's drops it.
            result.grad = copy.deepcopy(self.grad, memo)
        return self._with_attributes(result, lambda value: copy.deepcopy(value, memo))

    def _with_attributes(self, result: SpmdTensor, copied) -> SpmdTensor:
        """``result`` given this tensor's other Python state, each value ``copied(value)``,
        as torch.Tensor's copies do: a Parameter's flag (``nn.Parameter`` of a subclass is
        the subclass with ``_is_param``), user attributes."""
        for name, value in self.__dict__.items():
            if name != "_h":
                setattr(result, name, copied(value))
        return result
