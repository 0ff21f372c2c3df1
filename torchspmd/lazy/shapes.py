"""Shape inference, cached: PyTorch's meta kernels run once per distinct call.

Running a meta kernel costs 100-400 us (they go through Python refs); a training loop
repeats the same calls every step, so every step after the first is a dict lookup. The
cache also interns :class:`Signature`s, whose small integer ids key compiled graphs.
"""

from __future__ import annotations

import torch

from torchspmd.lazy.meta_functions import META_FUNCTIONS
from torchspmd.lazy.node import TENSOR, ScalarSlot, Signature, TensorMeta
from torchspmd.lowering.dtypes import to_jax_dtype

# (id(op), template, kw_template, input metas) -> Signature. One of the design's registries.
_SIGNATURES: dict[tuple, Signature] = {}


class UnsupportedOp(NotImplementedError):
    """Raised when an op's output shape depends on data (``nonzero``, boolean masks...)."""


def signature(op, template: tuple, kw_template: tuple, metas: tuple, scalars: tuple) -> Signature:
    """The interned signature of ``op`` called with ``template`` over inputs of ``metas``.

    ``scalars`` (the values of the template's ScalarSlots) are used only on a miss, to call
    the meta kernel with real numbers.
    """
    key = (id(op), template, kw_template, metas)  # ops are singletons; id() hashes fast
    sig = _SIGNATURES.get(key)
    if sig is None:
        outputs = _infer(op, template, kw_template, metas, scalars)
        sig = _SIGNATURES[key] = Signature(len(_SIGNATURES), op, template, kw_template, outputs)
    return sig


def _infer(op, template, kw_template, metas, scalars) -> tuple:
    fill = _Filler(metas, scalars)
    args = fill(template)
    kwargs = {k: fill(v) for k, v in kw_template}
    if _takes_device(op):  # factory ops: infer on the meta device, never allocate
        kwargs["device"] = "meta"
    try:
        out = META_FUNCTIONS.get(op, op)(*args, **kwargs)
    except NotImplementedError as e:
        raise UnsupportedOp(
            f"torchspmd: {op.__name__} is not supported on the spmd device: its output "
            "shape cannot be inferred (it depends on the data, or PyTorch has no meta "
            "kernel for it). Move the tensor to the CPU first (t.cpu()).") from e
    if isinstance(out, torch.Tensor):
        return (_meta_of(out),)
    if isinstance(out, (tuple, list)):
        return tuple(_meta_of(o) for o in out)
    return (None,)


def _takes_device(op) -> bool:
    schema = getattr(op, "_schema", None)  # annotation pseudo-ops have none
    return schema is not None and any(a.name == "device" and a.kwarg_only for a in schema.arguments)


def _meta_of(out):
    if isinstance(out, torch.Tensor):
        # A dtype JAX lacks (complex32) fails here, at the op that makes it, not at sync.
        to_jax_dtype(out.dtype)
        return TensorMeta(tuple(out.shape), tuple(out.stride()), out.dtype)
    if isinstance(out, (tuple, list)):  # a Tensor[] output (split, unbind)
        return tuple(_meta_of(o) for o in out)
    return None


class _Filler:
    """Rebuilds meta-device arguments from a template, consuming metas and scalars in order."""

    def __init__(self, metas, scalars):
        self.metas = iter(metas)
        self.scalars = iter(scalars)

    def __call__(self, item):
        if item is TENSOR:
            m = next(self.metas)
            return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
        if isinstance(item, ScalarSlot):
            return next(self.scalars)
        if isinstance(item, tuple):
            return [self(i) for i in item]
        return item


def cache_size() -> int:
    """Number of distinct calls seen (for metrics)."""
    return len(_SIGNATURES)
