"""What an aten overload's schema says about its arguments, cached per overload.

The recorder needs three facts per op: which arguments are tensors, which Python numbers
are values (``Scalar``: graph inputs) rather than sizes or dims (static), and, for ops
that mutate an argument, the functional overload that computes the new value instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch._ops import OpOverload

aten = torch.ops.aten

STATIC, TENSOR, TENSORS, SCALAR, SCALARS, EXPONENT, INDICES, HOST_TENSOR = range(8)
# INDICES: an indexing op's ``Tensor?[]`` (``x[i]``, ``x[i] = v``), where PyTorch lets a
# device tensor be indexed by CPU tensors (they go to the device with the op).
# HOST_TENSOR: a tensor argument that may be a CPU tensor, which goes to the device with
# the op, as on CUDA: CTC's lengths (``F.ctc_loss`` is called with CPU lengths).
_HOST_TENSORS = {("_ctc_loss", "input_lengths"), ("_ctc_loss", "target_lengths"),
                 ("_ctc_loss_backward", "input_lengths"), ("_ctc_loss_backward", "target_lengths")}

# Scalars that decide output shapes must stay static.
_SHAPE_SCALAR_OPS = {"arange", "range", "linspace", "logspace", "randint", "randint_like",
                     "randperm"}

# A power's exponent: static when it is one XLA and PyTorch compute otherwise than a
# general power (``x ** 2`` as ``x * x``, ``x ** 0.5`` as a square root), a graph input
# for any other value (``EXPONENT``; ``device/aten_calls.py`` decides per value). As
# data, ``x.pow(2)`` in every RMSNorm was a general ``pow`` kernel XLA could not simplify.
SPECIAL_EXPONENTS = frozenset({-2, -1, 0, 1, 2, 3, -0.5, 0.5})  # PyTorch's own special cases
_EXPONENT_OPS = {"pow", "pow_"}

# A fused optimizer's ``float lr`` is a value: a schedule changes it every step, and as a
# constant each new rate would compile a new program (``lowering/fused_optimizers.py``).
_LEARNING_RATE_OPS = {f"_fused_{name}{suffix}" for name in ("adam", "adamw", "sgd", "adagrad")
                      for suffix in ("", "_")}


def _kind(arg: torch.Argument, op_name: str) -> int:
    text = str(arg.type)
    if arg.name == "lr" and text == "float" and op_name in _LEARNING_RATE_OPS:
        return SCALAR
    if "Tensor" in text:
        if text.startswith("List[Optional[Tensor]]"):
            return INDICES
        if (op_name, arg.name) in _HOST_TENSORS:
            return HOST_TENSOR
        return TENSORS if text.startswith("List") else TENSOR
    if "number" in text and op_name not in _SHAPE_SCALAR_OPS:
        if op_name in _EXPONENT_OPS and arg.name == "exponent":
            return EXPONENT
        return SCALARS if text.startswith("List") else SCALAR
    return STATIC


@dataclass(frozen=True)
class OpSchema:
    """Argument kinds of one overload: ``positional[i]`` and ``keyword[name]``."""

    positional: tuple[int, ...]
    keyword: dict[str, int]
    mutated: tuple[int, ...]  # positions of arguments the op writes to
    mutated_kw: tuple[str, ...]  # keyword-only arguments it writes to (``out=``)
    is_view: bool
    is_inplace_view: bool  # t_, transpose_, ...: changes the tensor's own shape

    @property
    def is_mutating(self) -> bool:
        return bool(self.mutated or self.mutated_kw)


@functools.cache
def op_schema(op: OpOverload) -> OpSchema:
    """The cached :class:`OpSchema` of ``op``. Example: ``op_schema(aten.add_.Tensor).mutated == (0,)``."""
    name = op._schema.name.split("::")[-1]
    positional, keyword, mutated, mutated_kw = [], {}, [], []
    for i, arg in enumerate(op._schema.arguments):
        kind = _kind(arg, name)
        written = arg.alias_info is not None and arg.alias_info.is_write
        if arg.kwarg_only:
            keyword[arg.name] = kind
            if written:
                mutated_kw.append(arg.name)
        else:
            positional.append(kind)
            if written:
                mutated.append(i)
        keyword.setdefault(arg.name, kind)
    inplace_view = torch.Tag.inplace_view in op.tags
    return OpSchema(tuple(positional), keyword, tuple(mutated), tuple(mutated_kw),
                    op.is_view and not inplace_view, inplace_view)


def _same_inputs(functional: OpOverload, mutating: OpOverload) -> bool:
    """Whether ``functional`` takes the mutating op's arguments (less its ``out=`` ones)."""
    want = [(a.name, str(a.type)) for a in mutating._schema.arguments
            if not (a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)]
    have = [(a.name, str(a.type)) for a in functional._schema.arguments]
    # Factory ops' functional forms add optional dtype/layout/device/pin_memory keywords.
    extra = [a for a in functional._schema.arguments[len(want):]]
    return have[:len(want)] == want and all(a.kwarg_only and a.name in _FACTORY_KWARGS for a in extra)


_FACTORY_KWARGS = {"dtype", "layout", "device", "pin_memory"}


def _same_types(functional: OpOverload, inplace: OpOverload) -> bool:
    """Whether ``functional`` takes in-place ``inplace``'s argument types, in order.

    Names are not compared: some functional twins call ``self`` ``input`` (``dropout``).
    """
    def types(op: OpOverload) -> list[tuple[str, bool]]:
        return [(str(a.type), a.kwarg_only) for a in op._schema.arguments]
    return types(functional) == types(inplace)


# Mutating ops whose functional twin cannot be found by name.
_FUNCTIONAL_BY_HAND = {
    "aten::copy_": "aten::copy",
    "aten::transpose_": "aten::transpose.int",  # transpose has no .default overload
    "aten::normal_": "aten::normal_functional",
    "aten::bernoulli_.float": "aten::bernoulli.p",
    "aten::_native_batch_norm_legit": "aten::_native_batch_norm_legit_functional",
    **{f"aten::__i{name}__.{overload}": f"aten::{target}.{overload}"
       for name, target in (("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor"),
                            ("lshift", "bitwise_left_shift"), ("rshift", "bitwise_right_shift"))
       for overload in ("Tensor", "Scalar")},
}


def _lookup(qualified: str) -> OpOverload | None:
    name, _, overload = qualified.partition(".")
    packet = getattr(aten, name.split("::")[-1], None)
    if packet is None:
        return None
    if overload == "Scalar" and not hasattr(packet, "Scalar"):  # bitwise shifts: Tensor_Scalar
        overload = "Tensor_Scalar"
    return getattr(packet, overload or "default", None)


@functools.cache
def functional_variant(op: OpOverload) -> OpOverload | None:
    """The overload computing what mutating ``op`` writes, without writing it.

    ``add_.Tensor -> add.Tensor``, ``add.out -> add.Tensor``,
    ``_native_batch_norm_legit -> _native_batch_norm_legit_functional``; ``None`` if unknown.
    """
    full = op._schema.name + ("." + op._overloadname if op._overloadname != "default" else "")
    if full in _FUNCTIONAL_BY_HAND:
        return _lookup(_FUNCTIONAL_BY_HAND[full])
    base = op._schema.name.split("::")[-1]
    if base.endswith("_") and not base.startswith("__"):
        packet = getattr(aten, base[:-1], None)
        if packet is not None:
            # The overload of the same name, if it takes the same argument types: overload
            # names do not always line up (``pow_.Scalar`` is ``pow.Tensor_Scalar``, while
            # ``pow.Scalar`` raises a number to a tensor power).
            same_name = getattr(packet, op._overloadname, None)
            others = [getattr(packet, name) for name in packet.overloads()]
            for candidate in [same_name, *others]:
                if (candidate is not None and not op_schema(candidate).is_mutating
                        and _same_types(candidate, op)):
                    return candidate
    packet = getattr(aten, base, None)
    if packet is not None:  # an ``.out`` overload: the overload of the same op without out
        for name in packet.overloads():
            candidate = getattr(packet, name)
            if not op_schema(candidate).is_mutating and _same_inputs(candidate, op):
                return candidate
    functional = getattr(aten, base + "_functional", None)
    return functional.default if functional is not None else None
