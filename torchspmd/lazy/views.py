"""Views over immutable values: re-deriving a view, and writing a view back to its base.

A view is the chain of view ops from its base. Reading it replays the chain on the base's
current value; writing it walks the chain backwards, scattering the new value into each
intermediate (``slice_scatter``, ``select_scatter``...), which yields the new base value.
XLA folds the replayed slices and scatters into in-place updates.

A chain with a step that has no such inverse (``expand``: ``x.expand(2, 4)[0].add_(1)``)
is written back as PyTorch's functionalization does: the final view's size, stride and
offset in the base's memory are composed (on meta tensors), and the new value is
``as_strided_scatter``-ed into the base. Only a view whose elements share memory
(``x.expand(2, 4).add_(1)``) raises PyTorch's error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from torchspmd.lazy.annotation import keep_annotation
from torchspmd.lazy.node import TENSOR, Node, TensorMeta
from torchspmd.lazy.record import freeze, meta_of, record, record_binary, record_unary

aten = torch.ops.aten


@dataclass(frozen=True)
class ViewStep:
    """One view op: ``op(prev, *args)`` (output ``index`` for multi-output views)."""

    op: object
    args: tuple  # the static arguments after ``self``, defaults filled in
    index: int = 0


# id(op) -> (op, defaults of its positional arguments after ``self``): reading a schema's
# arguments builds Python objects each time, and every view op of a step needs them.
_DEFAULTS: dict[int, tuple] = {}
# (id(op), frozen arguments, index) -> (op, ViewStep): a step's view ops repeat every
# step, and building a frozen dataclass costs more than finding it.
_STEPS: dict[tuple, tuple] = {}
_STEPS_LIMIT = 65536
# id(op) -> (op, its step) for ops called without arguments: found without building the
# key above (ops are singletons, looked up by ``id``: hashing one runs Python code).
_BARE_STEPS: dict[int, tuple] = {}


def view_step(op, args: tuple, index: int = 0) -> ViewStep:
    """A :class:`ViewStep` with the schema's defaults filled in, so inverses see every argument."""
    if not args and index == 0:  # ``detach``: autograd makes one per gradient
        known = _BARE_STEPS.get(id(op))
        if known is not None and known[0] is op:
            return known[1]
    entry = _DEFAULTS.get(id(op))
    if entry is None or entry[0] is not op:
        defaults = tuple(a.default_value for a in op._schema.arguments[1:] if not a.kwarg_only)
        entry = _DEFAULTS[id(op)] = (op, defaults)
    frozen = freeze(list(args) + list(entry[1][len(args):]))
    key = (id(op), frozen, index)
    try:
        known = _STEPS.get(key)
    except TypeError:  # an unhashable argument: not cached
        return ViewStep(op, frozen, index)
    if known is not None and known[0] is op:
        return known[1]
    if len(_STEPS) >= _STEPS_LIMIT:
        _STEPS.clear()
    step = ViewStep(op, frozen, index)
    _STEPS[key] = (op, step)
    if not args and index == 0:
        _BARE_STEPS[id(op)] = (op, step)
    return step


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
    """Set ``storage`` to the base value whose view ``steps`` equals ``new_value``
    (``steps`` empty: ``new_value`` itself, for a chain of identity views).

    The base keeps its sharding annotation (as PyTorch/XLA keeps a tensor's sharding
    through in-place updates of its views).
    """
    if not steps:  # identity views (nn.Parameter, detach()) write as their base
        storage.set(keep_annotation(storage.value, new_value))
        return
    if any(_name(step) not in _STEPWISE for step in steps):
        storage.set(keep_annotation(storage.value, _strided_write(storage, steps, new_value)))
        return
    chain = [storage.value]
    for step in steps[:-1]:
        chain.append(apply(step, chain[-1]))
    value = new_value
    for step, prev in zip(reversed(steps), reversed(chain)):
        value = _inverse(step, prev, value)
    storage.set(keep_annotation(chain[0], value))


def _name(step: ViewStep) -> str:
    return step.op._schema.name.split("::")[-1]


def _inverse(step: ViewStep, prev, value):
    """The new ``prev`` such that ``step(prev) == value``."""
    if step.op is aten.view.dtype:  # ``x.view(torch.int32)``: reinterpret the bits back
        return record_unary(aten.view.dtype, value, meta_of(prev).dtype)
    return _STEPWISE[_name(step)](step, prev, value)


def _strided_write(storage, steps: tuple, value: tuple[Node, int]) -> tuple[Node, int]:
    """The base value after writing ``value`` to the view ``steps`` of ``storage``.

    The view is located in the base's memory (size, stride, offset) and scattered there.
    """
    retyping = [_name(step) for step in steps if _name(step) in _RETYPING
                or step.op is aten.view.dtype]
    if retyping:
        raise NotImplementedError(
            f"torchspmd: writing through this chain of views ({', '.join(_name(s) for s in steps)})"
            f" is not supported: it reinterprets the element type ({retyping[0]}) and also "
            "needs a view with no inverse. clone() the view, modify the clone, and build the "
            "new tensor from it (e.g. torch.view_as_complex(clone)).")
    size, stride, offset = _located(storage.meta, steps)
    if _overlaps(size, stride):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers "
            "to a single memory location. Please clone() the tensor before performing the "
            "operation.")
    base, meta = storage.value, storage.meta
    order = memory_order(meta)
    if order is None:
        raise NotImplementedError(
            "torchspmd: writing through this view of a tensor whose memory has gaps is not "
            "supported; clone() the view, modify the clone, and copy_() it back.")
    if order != sorted(order):  # memory order differs from dim order: scatter in memory order
        base = record_unary(aten.permute.default, base, order)
    base = record_binary(aten.as_strided_scatter.default, base, value, list(size), list(stride),
                         offset)
    if order != sorted(order):
        base = record_unary(aten.permute.default, base, [order.index(d) for d in range(len(order))])
    return base


# PyTorch's error for an in-place op reading memory it writes through another view.
OVERLAP_MESSAGE = ("unsupported operation: some elements of the input tensor and the written-to "
                   "tensor refer to a single memory location. Please clone() the tensor before "
                   "performing the operation.")

# Views larger than this are not compared element by element (``reads_overwritten``,
# ``_overlaps``).
_COMPARED_ELEMENTS = 1 << 22


def reads_overwritten(base_meta: TensorMeta, written: tuple, read: tuple) -> bool:
    """Whether an in-place write to the view ``written`` of a storage would read, through
    the view ``read`` of the same storage, memory it overwrites other than element for
    element: the two views share a memory location and are not the same view.

    PyTorch refuses such an op (``x.add_(x[0])``, ``x.add_(x.t())``); where its check
    cannot tell (``x.add_(x.diagonal())``) a CPU kernel reads some elements before and
    some after writing them, an order-dependent result, where a lazy write reads them
    all before. Views of more than ``_COMPARED_ELEMENTS`` elements whose memory ranges
    meet are not compared (``False``), as PyTorch does not.

    Example::

        >>> import torch
        >>> meta = TensorMeta((3, 3), (3, 1), torch.float32)
        >>> row = (view_step(aten.select.int, (0, 0)),)
        >>> reads_overwritten(meta, (), row), reads_overwritten(meta, row, row)
        (True, False)
    """
    views = _to_compare(base_meta, written, read)
    return views is not None and np.intersect1d(_offsets(*views[0]), _offsets(*views[1])).size > 0


def pointwise_reads_overwritten(base_meta: TensorMeta, written: tuple, read: tuple,
                                copy: bool = False) -> bool:
    """Whether a pointwise op (``copy`` for ``copy_``) into the view ``written`` of a
    storage, reading the view ``read`` of the same storage broadcast to ``written``'s
    shape, has an order-dependent result: some element reads a location that another
    element writes.

    A lazy op reads every element before it writes; CPU's kernel goes element by
    element, and its own overlap check gives up on views that are not dense
    (``x[1] = x.diagonal()`` of a 3-d ``x``). Overlaps that cannot change the result are
    allowed, as on CPU: an element read only by the position that writes it
    (``x.diagonal().add_(x[0])``), and for a copy an element copied onto itself, whoever
    else reads it (``x[0] = x[:, 0]``).

    Example::

        >>> import torch
        >>> meta = TensorMeta((3, 3), (3, 1), torch.float32)
        >>> row = (view_step(aten.select.int, (0, 0)),)
        >>> column = (view_step(aten.select.int, (1, 0)),)
        >>> diagonal = (view_step(aten.diagonal.default, ()),)
        >>> pointwise_reads_overwritten(meta, diagonal, row)
        False
        >>> pointwise_reads_overwritten(meta, row, column, copy=True)
        False
        >>> pointwise_reads_overwritten(meta, (), diagonal)  # x.add_(x.diagonal())
        True
    """
    views = _to_compare(base_meta, written, read)
    if views is None:
        return False
    w, r = views
    writes = _offsets(*w).reshape(w[0])
    try:
        reads = np.broadcast_to(_offsets(*r).reshape(r[0]), w[0])
    except ValueError:  # shapes the op refuses: its own check raises PyTorch's error
        return False
    elsewhere = writes != reads  # positions reading another location than they write
    if copy:  # a location copied onto itself keeps its value: only new values matter
        return bool(np.isin(writes[elsewhere], reads).any())
    return bool(np.isin(reads[elsewhere], writes).any())


def _to_compare(base_meta: TensorMeta, written: tuple, read: tuple) -> tuple | None:
    """The located ``(written, read)`` views of a storage when their elements must be
    compared: distinct views whose memory ranges meet, neither larger than
    ``_COMPARED_ELEMENTS``; else None (they cannot overlap, or are not compared)."""
    if written == read:
        return None
    w, r = _located(base_meta, written), _located(base_meta, read)
    if w == r or not _ranges_meet(w, r):
        return None
    if math.prod(w[0]) > _COMPARED_ELEMENTS or math.prod(r[0]) > _COMPARED_ELEMENTS:
        return None
    return w, r


def _ranges_meet(a: tuple, b: tuple) -> bool:
    """Whether the memory ranges [first, last element] of two located views meet."""
    spans = []
    for size, stride, offset in (a, b):
        if 0 in size:
            return False
        spans.append((offset, offset + sum((n - 1) * st for n, st in zip(size, stride))))
    return spans[0][0] <= spans[1][1] and spans[1][0] <= spans[0][1]


def _offsets(size: tuple, stride: tuple, offset: int) -> np.ndarray:
    """Every element's memory offset of a (size, stride, offset) view."""
    found = np.full((), offset, dtype=np.int64)
    for n, st in zip(size, stride):
        found = np.add.outer(found, np.arange(n, dtype=np.int64) * st)
    return found.ravel()


def storage_offset(base_meta: TensorMeta, steps: tuple) -> int:
    """The storage offset, in elements, of the view ``steps`` of a ``base_meta`` tensor
    (what ``t.storage_offset()`` is on CPU).

    >>> storage_offset(TensorMeta((4, 5), (5, 1), torch.float32), ())  # doctest: +SKIP
    0
    """
    return _located(base_meta, steps)[2] if steps else 0


@functools.lru_cache(maxsize=1024)
def _located(base_meta: TensorMeta, steps: tuple) -> tuple[tuple, tuple, int]:
    """Size, stride and storage offset of the view ``steps`` of a ``base_meta`` tensor."""
    t = torch.empty_strided(base_meta.shape, base_meta.stride, dtype=base_meta.dtype,
                            device="meta")
    for step in steps:
        out = step.op(t, *step.args)
        t = out[step.index] if isinstance(out, (list, tuple)) else out
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def memory_order(meta: TensorMeta) -> list[int] | None:
    """The dims of a storage laid out as ``meta``, from the largest stride to the smallest
    (its memory order: a permute by it puts the elements in memory order), or None if
    its memory has gaps or overlaps. ``[0, 1]`` for a row-major matrix, ``[0, 2, 3, 1]``
    for a channels-last image batch."""
    if _overlaps(meta.shape, meta.stride) or not _dense(meta):
        return None
    return sorted(range(len(meta.shape)), key=lambda d: -meta.stride[d])


def _dense(meta: TensorMeta) -> bool:
    """Whether ``meta``'s elements fill ``numel`` consecutive memory slots (any dim order)."""
    expected = 1
    for size, stride in sorted(zip(meta.shape, meta.stride), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _overlaps(size, stride) -> bool:
    """Whether two elements of a (size, stride) view share a memory location."""
    dims = sorted((st, sz) for sz, st in zip(size, stride) if sz > 1)
    if any(st == 0 for st, _ in dims):
        return True
    reach = 0
    for st, sz in dims:
        if st <= reach:
            break
        reach += st * (sz - 1)
    else:
        return False
    if math.prod(size) > _COMPARED_ELEMENTS:  # too large to check element by element: be safe
        return True
    offsets = _offsets(size, stride, 0)
    return np.unique(offsets).size != offsets.size


def _same(step, prev, value):
    return value


def _conj_back(step, prev, value):
    # The spmd device has no conjugate bit: ``x.conj()`` is a view whose value is conj(x).
    return record_unary(aten._conj_physical.default, value)


def _reshape_back(step, prev, value):
    # A copy, not a view: the value coming back (e.g. through an inverse transpose) may have
    # strides no view of that size could have, which a view op's shape inference refuses.
    return record_unary(aten._reshape_copy.default, value, list(meta_of(prev).shape))


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


def _view_as_real_back(step, prev, value):
    return record_unary(aten.view_as_complex.default, value)


def _view_as_complex_back(step, prev, value):
    return record_unary(aten.view_as_real.default, value)


def _as_strided_back(step, prev, value):
    return record_binary(aten.as_strided_scatter.default, prev, value, *step.args[:3])


# View ops written back one step at a time; any other view (``expand``, ``unfold``...)
# makes the whole chain be written back through its place in memory (_strided_write).
_STEPWISE = {
    "alias": _same, "detach": _same, "lift_fresh": _same, "_conj": _conj_back,
    "view": _reshape_back, "_reshape_alias": _reshape_back, "squeeze": _reshape_back,
    "unsqueeze": _reshape_back, "reshape": _reshape_back, "flatten": _reshape_back,
    "permute": _permute_back, "transpose": _transpose_back, "t": _t_back,
    "slice": _slice_back, "select": _select_back,
    "split": _split_back, "split_with_sizes": _split_back, "unbind": _unbind_back,
    "diagonal": _diagonal_back, "as_strided": _as_strided_back,
    # A complex tensor's ``.real`` / ``.imag`` are views through view_as_real; a strided
    # write cannot express them (the dtype changes), so these must be inverted stepwise.
    "view_as_real": _view_as_real_back, "view_as_complex": _view_as_complex_back,
}

# Views that reinterpret the element type: their place in memory is counted in other
# elements than the base's, so they cannot be written back through as_strided_scatter.
_RETYPING = {"view_as_real", "view_as_complex"}
