"""Views over immutable values: re-deriving a view, and writing a view back to its base.

A view is the chain of view ops from its base. Reading it replays the chain on the base's
current value; writing it walks the chain backwards, scattering the new value into each
intermediate (``slice_scatter``, ``select_scatter``...), which yields the new base value.
XLA folds the replayed slices and scatters into in-place updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchspmd.lazy.node import TENSOR, Node, TensorMeta
from torchspmd.lazy.record import freeze, meta_of, record, record_binary, record_unary

aten = torch.ops.aten


@dataclass(frozen=True)
class ViewStep:
    """One view op: ``op(prev, *args)`` (output ``index`` for multi-output views)."""

    op: object
    args: tuple  # the static arguments after ``self``, defaults filled in
    index: int = 0


def view_step(op, args: tuple, index: int = 0) -> ViewStep:
    """A :class:`ViewStep` with the schema's defaults filled in, so inverses see every argument."""
    schema_args = op._schema.arguments[1:]
    full = list(args) + [a.default_value for a in schema_args[len(args):] if not a.kwarg_only]
    return ViewStep(op, freeze(full), index)


def apply(step: ViewStep, value: tuple[Node, int]) -> tuple[Node, int]:
    """The value of ``step`` applied to ``value``."""
    node = record(step.op, (TENSOR, *step.args), (), (value,), (meta_of(value),))
    return (node, step.index)


def derive(base: tuple[Node, int], base_meta: TensorMeta, steps: tuple) -> tuple[Node, int]:
    """Replay ``steps`` on the base's value."""
    value = base
    for step in steps:
        value = apply(step, value)
    return value


def write_back(storage, steps: tuple, new_value: tuple[Node, int]) -> None:
    """Set ``storage`` to the base value whose view ``steps`` equals ``new_value``."""
    chain = [storage.value]
    for step in steps[:-1]:
        chain.append(apply(step, chain[-1]))
    value = new_value
    for step, prev in zip(reversed(steps), reversed(chain)):
        value = _inverse(step, prev, value)
    storage.set(value)


def _inverse(step: ViewStep, prev, value):
    """The new ``prev`` such that ``step(prev) == value``."""
    name = step.op._schema.name.split("::")[-1]
    inverse = _INVERSES.get(name)
    if inverse is None:
        raise NotImplementedError(
            f"torchspmd: writing through a view made by aten::{name} is not supported; "
            f"clone() the view, modify the clone, and copy_() it back.")
    return inverse(step, prev, value)


def _same(step, prev, value):
    return value


def _reshape_back(step, prev, value):
    return record_unary(aten._unsafe_view.default, value, list(meta_of(prev).shape))


def _permute_back(step, prev, value):
    dims = [d % len(step.args[0]) for d in step.args[0]]
    return record_unary(aten.permute.default, value, [dims.index(i) for i in range(len(dims))])


def _transpose_back(step, prev, value):
    return record_unary(aten.transpose.int, value, *step.args[:2])


def _t_back(step, prev, value):
    return record_unary(aten.t.default, value)


def _slice_back(step, prev, value):
    dim, start, end, stride = step.args
    return record_binary(aten.slice_scatter.default, prev, value, dim, start, end, stride)


def _select_back(step, prev, value):
    return record_binary(aten.select_scatter.default, prev, value, *step.args[:2])


def _split_back(step, prev, value):
    dim_size = meta_of(prev).shape[step.args[1] if len(step.args) > 1 else 0]
    if step.op._schema.name == "aten::split_with_sizes":
        sizes, dim = step.args[0], step.args[1]
    else:
        size, dim = step.args[0], step.args[1]
        sizes = [min(size, dim_size - i) for i in range(0, dim_size, size)] or [0]
    start = sum(sizes[: step.index])
    return record_binary(aten.slice_scatter.default, prev, value, dim, start,
                         start + sizes[step.index], 1)


def _unbind_back(step, prev, value):
    return record_binary(aten.select_scatter.default, prev, value, step.args[0], step.index)


def _diagonal_back(step, prev, value):
    return record_binary(aten.diagonal_scatter.default, prev, value, *step.args[:3])


def _as_strided_back(step, prev, value):
    return record_binary(aten.as_strided_scatter.default, prev, value, *step.args[:3])


def _expand_back(step, prev, value):
    raise RuntimeError(
        "unsupported operation: more than one element of the written-to tensor refers to a "
        "single memory location. Please clone() the tensor before performing the operation.")


_INVERSES = {
    "alias": _same, "detach": _same, "lift_fresh": _same, "_conj": _same,
    "view": _reshape_back, "_reshape_alias": _reshape_back, "squeeze": _reshape_back,
    "unsqueeze": _reshape_back, "reshape": _reshape_back, "flatten": _reshape_back,
    "permute": _permute_back, "transpose": _transpose_back, "t": _t_back,
    "slice": _slice_back, "select": _select_back,
    "split": _split_back, "split_with_sizes": _split_back, "unbind": _unbind_back,
    "diagonal": _diagonal_back, "as_strided": _as_strided_back, "expand": _expand_back,
}
