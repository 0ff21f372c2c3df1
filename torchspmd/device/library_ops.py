"""Custom ops other libraries register (``torch.library``), written in aten ops.

A library may route its work through a custom op of its own, a Python loop that
``torch.compile`` treats as one opaque call. Such ops reach the spmd device with no
lowering; the ones here are decomposed into aten ops torchspmd lowers. They exist only
once their library is imported, so they are looked up by name.

- ``transformers::grouped_mm_fallback`` (and its backward): Hugging Face's mixture of
  experts under ``torch.compiler.is_compiling()`` with float32 weights. A loop of one
  ``mm`` per expert over ``offs.tolist()`` (a host read) in the library; here
  ``aten._grouped_mm`` with the same ``offs``.

Example::

    decomposition("transformers::grouped_mm_fallback")(x, w, offs)   # x's rows by expert
"""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten


def _grouped_mm_fallback(input, weight, offs):
    return aten._grouped_mm(input, weight, offs=offs)


def _grouped_mm_fallback_backward(input, weight, offs, grad_output):
    grad_input = aten._grouped_mm(grad_output, weight.transpose(1, 2), offs=offs)
    grad_weight = aten._grouped_mm(input.t(), grad_output, offs=offs)
    return grad_input, grad_weight


_BY_NAME: dict[str, Callable] = {
    "transformers::grouped_mm_fallback": _grouped_mm_fallback,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_fallback_backward,
}


def decomposition(name: str) -> Callable | None:
    """The aten decomposition of the custom op named ``name`` (``"ns::op"``), or None."""
    return _BY_NAME.get(name)
