"""The ``'xla'`` device name: tensors that name it land on the spmd device.

PyTorch has its own ``XLA`` dispatch key, unused without torch_xla: its allocation and factory
kernels are registered to make spmd tensors (``device.backend.register_device_alias``), so
``torch.zeros(3, device="xla")`` and ``t.to("xla:0")`` work. A bare ``"xla"`` (no index) in
``torch.tensor``/``torch.as_tensor``/``Tensor.to`` makes PyTorch ask for a device guard it has
only for its built-in backends; those three calls are wrapped to say ``"spmd"`` instead.
"""

from __future__ import annotations

import functools

import torch

from torchspmd.device.backend import device as spmd_device
from torchspmd.device.backend import register_device_alias


def _spmd_if_xla(device):
    """``device`` with an ``xla`` device type replaced by the spmd device."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "xla":
        index = torch.device(device).index
        if index not in (None, 0):
            raise RuntimeError(f"torchspmd.compat: {device} names device {index}; under SPMD there "
                               f"is one virtual device (xla:0 = spmd:0) spanning every physical "
                               f"device. Place work on some of them with a Mesh.")
        return spmd_device()
    return device


def _rewriting_device(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _spmd_if_xla(kwargs["device"])
        return fn(*args, **kwargs)
    return call


def _rewriting_to(to):
    @functools.wraps(to)
    def call(self, *args, **kwargs):
        args = tuple(_spmd_if_xla(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _spmd_if_xla(kwargs["device"])
        return to(self, *args, **kwargs)
    return call


_INSTALLED: list = []  # the wrapped originals, once installed


def install() -> None:
    """Route the ``xla`` device type to the spmd device (idempotent).

    Example: ``install(); torch.tensor([1.0], device="xla").device`` is ``spmd:0``.
    """
    if _INSTALLED:
        return
    register_device_alias("XLA")
    # Tensor.to is TensorBase's: uninstall() deletes the override rather than copying it.
    _INSTALLED.append((torch.tensor, torch.as_tensor, torch.Tensor.__dict__.get("to")))
    torch.tensor = _rewriting_device(torch.tensor)
    torch.as_tensor = _rewriting_device(torch.as_tensor)
    torch.Tensor.to = _rewriting_to(torch.Tensor.to)


def uninstall() -> None:
    """Give ``torch.tensor``, ``torch.as_tensor`` and ``Tensor.to`` back to PyTorch.

    The ``XLA`` key's kernels stay: without torch_xla nothing else can use that device.
    Example: ``install(); uninstall()``.
    """
    if _INSTALLED:
        torch.tensor, torch.as_tensor, own_to = _INSTALLED.pop()
        if own_to is None:
            del torch.Tensor.to
        else:
            torch.Tensor.to = own_to
