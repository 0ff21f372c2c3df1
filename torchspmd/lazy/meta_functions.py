"""Output shapes for the few lowered ops PyTorch has no meta kernel for.

Shape inference runs an op's meta kernel; for these ops it runs the function here instead,
on the same meta-device arguments, so they are recorded like any other op. The table is
the lowering registry's: a lowering module adds its own with ``registry.infers``.

Example: ``META_FUNCTIONS[aten.geqrf.default](a)`` for ``a`` of shape (5, 3) returns meta
tensors of shapes (5, 3) and (3,).
"""

import torch

from torchspmd.lowering.registry import META_FUNCTIONS

aten = torch.ops.aten


def _geqrf(self):
    if self.dim() < 2:
        raise RuntimeError(f"torch.geqrf: input must have at least 2 dimensions, got {self.dim()}")
    m, n = self.shape[-2:]
    return torch.empty_like(self), self.new_empty((*self.shape[:-2], min(m, n)))


# aten overload -> a function of meta tensors returning the op's outputs as meta tensors.
META_FUNCTIONS[aten.geqrf.default] = _geqrf
