"""Where every op on an spmd tensor enters: record it, or run what must run now.

Functional ops with a lowering become IR nodes; view ops share their input's storage;
ops that mutate an argument are recorded as their functional form and the result is
assigned to the argument; ops whose output shape depends on the data read a size first
(``data_dependent``); ops without a lowering use a PyTorch decomposition; anything
else raises a ``NotImplementedError`` that names the op.
"""

from __future__ import annotations

import time

import torch

from torchspmd.device import bounds, host, index_checks, resize
from torchspmd.device.aten_calls import (FACTS, SPECIAL, decompose, flatten, host_value,
                                         identity_view, op_facts, record_call, record_flat,
                                         record_view, shape_result, unsupported, wrap_outputs,
                                         wrap_views)
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.annotation import annotation, peel, sharded_value
from torchspmd.lazy.handle import Handle, unkept
from torchspmd.lazy.node import IDENTITY_IDS, TENSOR, Node
from torchspmd.lazy.record import meta_of, record, record_unary
from torchspmd.lazy.schema import functional_variant, op_schema
from torchspmd.lazy.shapes import signature
from torchspmd.lazy.views import (OVERLAP_MESSAGE, pointwise_reads_overwritten,
                                  reads_overwritten, view_step)
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT
from torchspmd.runtime.metrics import COUNTERS

__all__ = ["dispatch", "register_handler", "_assign", "host_value", "record_call", "wrap_outputs"]

aten = torch.ops.aten

_CHECKED_INDICES = bounds._STATE
_INDEX_CHECKS = index_checks._STATE


def dispatch(func, args: tuple, kwargs: dict):
    """Handle one aten call on spmd tensors (``SpmdTensor.__torch_dispatch__``)."""
    if _CHECKED_INDICES["on"]:  # torchspmd.debug.check_indices(True)
        bounds.check(func, args, kwargs)
    if _INDEX_CHECKS.on:  # in-graph, read later (torchspmd.debug.index_checks)
        index_checks.note(func, args, kwargs)
    facts = FACTS.get(id(func))  # op_facts, its hit inline
    if facts is None or facts.func is not func:
        facts = op_facts(func)
    if facts.special is not None:  # may run a graph: not counted as tracing
        return facts.special(*args, **kwargs)
    data_dependent = facts.data_dependent  # reads a size on the host: not counted either
    if data_dependent is not None and data_dependent.applies(*args, **kwargs):
        return data_dependent.run(*args, **kwargs)
    start = time.perf_counter()
    if facts.inplace_view:
        result = _inplace_view(func, args, kwargs)
    elif facts.mutating:
        result = _mutate(func, facts.schema, args, kwargs)
    elif facts.identity and (not args[0]._h.view or args[0]._h.identity):
        result = identity_view(func, args)
    elif facts.plain_view and not kwargs and type(args[0]) is SpmdTensor:
        result = wrap_views(func, args, record_view(func, facts, args), facts)
    elif facts.lowered:
        node = record_flat(func, facts, flatten(facts, args, kwargs))
        if facts.view:
            result = wrap_views(func, args, node, facts)
        elif facts.form == "single":  # most ops: one tensor out, no list to build
            meta = node.sig.outputs[0]
            result = None if meta is None else SpmdTensor(Handle.new((node, 0), meta))
        else:
            result = wrap_outputs(func, node)
    else:
        result = decompose(func, args, kwargs)
    COUNTERS["trace_time_s"] += time.perf_counter() - start
    return result


_DYNAMO_REASON = ("torchspmd: spmd tensors are traced by torchspmd.compile, not torch.compile; "
                  "decorate the training step with @torchspmd.compile")
# TorchDynamo must neither trace into dispatch nor compile the frames it calls (meta
# kernels, decompositions): ``torch._dynamo.disable`` does both, but its wrapper costs
# about a microsecond per op, paid by every op of a training step. ``_entry`` goes
# through it only while a torch.compile frame is running on this thread.
_DISABLED = torch._dynamo.disable(dispatch, reason=_DYNAMO_REASON)
_EVAL_FRAME_CALLBACK = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", None)


def _entry(func, args: tuple, kwargs: dict):
    if _EVAL_FRAME_CALLBACK() is None:  # no TorchDynamo here: nothing to keep out
        return dispatch(func, args, kwargs)
    return _DISABLED(func, args, kwargs)


def _install_entry() -> None:
    """``_entry`` as the device's dispatcher, dressed as the disabled function TorchDynamo
    reads when it meets it while tracing (a graph break naming torchspmd.compile). The
    markers are TorchDynamo's private attributes: where this torch lacks one, every op
    goes through the disabled wrapper instead (correct, a microsecond slower)."""
    markers = ("_torchdynamo_disable", "_torchdynamo_disable_msg",
               "_torchdynamo_disable_recursive", "_torchdynamo_orig_callable")
    skip_code = getattr(torch._dynamo.eval_frame, "skip_code", None)
    if _EVAL_FRAME_CALLBACK is None or skip_code is None or \
            not all(hasattr(_DISABLED, m) for m in markers):
        SpmdTensor._dispatch = staticmethod(_DISABLED)
        return
    for marker in markers:
        setattr(_entry, marker, getattr(_DISABLED, marker))
    _entry._torchdynamo_wrapper_id = id(_entry)
    skip_code(_entry.__code__)  # run as it is under a callback
    # The frame that calls it too: TorchDynamo would compile it for each argument count
    # it meets (up to its recompile limit, warning each time) to reach the call above.
    skip_code(SpmdTensor.__torch_dispatch__.__func__.__code__)
    SpmdTensor._dispatch = staticmethod(_entry)


_install_entry()


# --- mutation --------------------------------------------------------------------------

def _mutate(func, schema, args, kwargs):
    """``x.add_(y)``, ``torch.add(a, b, out=c)``: record the functional form, then assign."""
    functional = functional_variant(func)
    if functional is None:
        raise unsupported(func)
    targets = [args[i] for i in schema.mutated] + [kwargs[k] for k in schema.mutated_kw]
    targets = [t for group in targets for t in (group if isinstance(group, (list, tuple)) else [group])]
    _refuse_overwritten_reads(func, targets, args, kwargs)
    call_kwargs = {k: v for k, v in kwargs.items() if k not in schema.mutated_kw}
    if schema.mutated_kw and "dtype" in op_schema(functional).keyword and "dtype" not in call_kwargs:
        call_kwargs["dtype"] = targets[0].dtype  # factory .out ops: the out tensor's dtype
    values = _compute_checked(func, functional, args, kwargs, call_kwargs, targets)
    extra = values[: len(values) - len(targets)]  # _functional ops return more first
    for target, value in zip(targets, values[len(extra):]):
        if schema.mutated_kw and meta_of(value).shape != tuple(target.shape):
            resize.fresh_storage(target, meta_of(value))  # out= tensors take the result's shape
        _assign(target, value)
    if extra:
        return shape_result(func, [SpmdTensor(Handle.new(v, meta_of(v))) for v in extra])
    return shape_result(func, targets) if op_facts(func).form != "none" else None


def _refuse_overwritten_reads(func, targets: list, args: tuple, kwargs: dict) -> None:
    """PyTorch's error for an in-place op that reads, through another view of the tensor it
    writes, memory the write changes (``x.add_(x[0])``; ``views.reads_overwritten``). A
    lazy op reads every input before it writes, a CPU kernel element by element: where
    PyTorch's own check cannot tell (``x.add_(x.diagonal())``) the two would differ. A
    pointwise op may read an element it writes at that element's own position, as on CPU
    (``x.diagonal().add_(x[0])``)."""
    overwritten = pointwise_reads_overwritten if torch.Tag.pointwise in func.tags \
        else reads_overwritten
    written: dict[int, list] = {}
    for t in targets:
        if isinstance(t, SpmdTensor):
            written.setdefault(id(t._h.storage), []).append(t._h)
    if not written:
        return
    for group in (*args, *kwargs.values()):
        for a in (group if isinstance(group, (list, tuple)) else (group,)):
            if not isinstance(a, SpmdTensor):
                continue
            read = a._h
            for handle in written.get(id(read.storage), ()):
                if read is not handle and overwritten(read.storage.meta, handle.view, read.view):
                    raise RuntimeError(OVERLAP_MESSAGE)


def _compute_checked(func, functional, args, kwargs, call_kwargs,
                     targets: list) -> list[tuple[Node, int]]:
    """The values ``functional`` computes, after PyTorch's own checks of mutating ``func``.

    The mutating op's meta kernel raises what PyTorch raises (bad casts, shapes); its
    signature is cached, so a training loop pays a dict lookup. An in-place op has the
    same arguments as its functional form, so one flattening serves both. A target's
    value that is only a constraint kept from its previous in-place update is read
    without it (``handle.unkept``): this op's result is constrained again.
    """
    flat = flatten(op_facts(func), args, kwargs)
    template, kw_template, inputs, metas, scalars = flat
    signature(func, template, kw_template, tuple(metas), tuple(scalars))
    facts = op_facts(functional)
    if not facts.lowered:
        out = decompose(functional, args, call_kwargs)
        return [o._h.value() for o in (out if isinstance(out, (list, tuple)) else [out])]
    if call_kwargs.keys() != kwargs.keys():  # out= dropped (or dtype added)
        flat = flatten(facts, args, call_kwargs)
    _skip_kept(flat[2], targets)
    node = record_flat(functional, facts, flat)
    return [(node, i) for i in range(len(node.sig.outputs))]


def _skip_kept(inputs: list, targets: list) -> None:
    """Replace, in ``inputs``, each target's kept constraint by the value under it."""
    under = None
    for target in targets:
        if type(target) is SpmdTensor:
            storage = target._h.storage
            if storage.kept is not None:
                raw = unkept(storage)
                if raw is not None:
                    if under is None:
                        under = {}
                    under[id(storage.kept)] = raw
    if under:
        for i, value in enumerate(inputs):
            raw = under.get(id(value))
            if raw is not None:
                inputs[i] = raw


def _keep_annotation(target, value):
    """An in-place op keeps its target's sharding annotation (as PyTorch/XLA re-applies it)."""
    if type(target) is not SpmdTensor and not isinstance(target, SpmdTensor):
        return value
    sharding = annotation(sharded_value(target._h))
    if sharding is None or annotation(value) is sharding:
        return value
    return record_unary(SHARDING_CONSTRAINT, value, sharding)


def _assign(target, value) -> None:
    """Write ``value`` into ``target`` (cast to its dtype and broadcast to its shape as
    PyTorch's in-place ops do); ``target`` keeps its sharding annotation."""
    if type(target) is not SpmdTensor and not isinstance(target, SpmdTensor):
        target.copy_(host.to_cpu_value(value))
        return
    handle = target._h
    meta = value[0].sig.outputs[value[1]]  # meta_of, inline
    if meta.dtype != handle.meta.dtype:
        value = (record(aten._to_copy.default, (TENSOR,), (("dtype", handle.meta.dtype),),
                        (value,), (meta,)), 0)
    if meta.shape != handle.meta.shape:
        # expand_copy, not expand: the value must be dense, as a view of it may be
        # written back through a reshape (`x.reshape(2, 3).copy_(row)`).
        value = (record(aten.expand_copy.default, (TENSOR, handle.meta.shape), (), (value,),
                        (meta_of(value),)), 0)
    # Annotated after the broadcast: the target's spec has the target's rank.
    if not handle.whole:
        handle.assign(_keep_annotation(target, value))
        return
    # A base, or an identity view (a parameter): the storage takes the value, with the
    # storage's annotation (all ``Handle.assign`` would do; an optimizer's every write).
    storage = handle.storage
    old = storage.value
    node = old[0]
    if node.arrays is None and node.host is None and id(node.sig.op) in IDENTITY_IDS:
        old = peel(old)
    sharding = annotation(old)
    if sharding is not None and annotation(value) is not sharding:
        kept = record_unary(SHARDING_CONSTRAINT, value, sharding)
        storage.set(kept)
        storage.kept = kept  # the next in-place op may read ``value`` instead
    else:
        storage.set(value)


def _inplace_view(func, args, kwargs):
    """``x.t_()``, ``x.unsqueeze_(0)``: ``x`` itself becomes a view of its old self."""
    target = args[0]
    functional = functional_variant(func)
    if functional is None or not op_facts(functional).lowered:
        raise unsupported(func)  # now, not as a lowering missing at the next read
    node = record_call(functional, args, kwargs)
    meta = node.sig.outputs[0]
    target._h = target._h.viewed(view_step(functional, tuple(args[1:])), (node, 0), meta)
    with torch._C._DisableTorchDispatch():
        torch.ops.aten.as_strided_.default(target, meta.shape, meta.stride)
    return target


def register_handler(op, handler) -> None:
    """Make ``handler(*args, **kwargs)`` run ``op`` on spmd tensors (for custom ops).

    Lets a package above this one (``sharding/``) implement its own ops without this
    module importing it. Example: ``register_handler(torch.ops.ns.op.default, fn)``.
    """
    SPECIAL[op] = handler
    FACTS.pop(id(op), None)
