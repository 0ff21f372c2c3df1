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
from torch._decomp import core_aten_decompositions, decomposition_table

from torchspmd.device import bounds, host, resize
from torchspmd.device.linalg_composites import LINALG_COMPOSITES
from torchspmd.device.data_dependent import DATA_DEPENDENT
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy import provenance
from torchspmd.lazy.annotation import annotation, peel, sharded_value
from torchspmd.lazy.handle import Handle, unkept
from torchspmd.lazy.node import TENSOR, Node, ScalarSlot, TensorMeta
from torchspmd.lazy.record import freeze, leaf_signature, meta_of, record, record_unary
from torchspmd.lazy.schema import (SCALAR, SCALARS, STATIC, TENSORS, functional_variant,
                                   op_schema)
from torchspmd.lazy.schema import TENSOR as KIND_TENSOR
from torchspmd.lazy.shapes import signature
from torchspmd.lazy.views import IDENTITY_OPS, view_step
from torchspmd.lowering import LOWERINGS, RANDOM_OPS
from torchspmd.lowering.annotations import SHARDING_CONSTRAINT
from torchspmd.runtime import rng, transfer
from torchspmd.runtime.metrics import COUNTERS

aten = torch.ops.aten

_CHECKED_INDICES = bounds._STATE
_RECORDING = provenance.ACTIVE  # a compiled step being recorded (Handle.value reports reads)

_SLOTS = {float: ScalarSlot(float), int: ScalarSlot(int), bool: ScalarSlot(bool)}
_DROPPED_KWARGS = ("device", "pin_memory", "layout")  # placement is ours to decide


class _Plan:
    """What dispatch needs to know about one op, worked out on its first call.

    One dict lookup per call instead of several: hashing an OpOverload runs Python code,
    so plans are found by the op's ``id`` (ops are singletons; ``func`` guards reuse).
    """

    __slots__ = ("func", "special", "data_dependent", "schema", "lowered", "random", "kinds",
                 "keyword", "form", "identity", "inplace_view", "mutating", "view")

    def __init__(self, func):
        self.func = func
        self.special = _SPECIAL.get(func)
        self.data_dependent = DATA_DEPENDENT.get(func)
        self.schema = op_schema(func)
        self.lowered = func in LOWERINGS
        self.random = func in RANDOM_OPS
        self.kinds = self.schema.positional
        self.keyword = self.schema.keyword
        self.form = _return_form(func)
        self.identity = func in IDENTITY_OPS  # detach, alias: a view showing its input
        # The schema's kinds, read once (``is_mutating`` is a property: a call per op).
        self.inplace_view = self.schema.is_inplace_view
        self.mutating = self.schema.is_mutating
        self.view = self.schema.is_view


_PLANS: dict[int, _Plan] = {}


def _plan(func) -> _Plan:
    plan = _PLANS.get(id(func))
    if plan is None or plan.func is not func:
        plan = _PLANS[id(func)] = _Plan(func)
    return plan


def dispatch(func, args: tuple, kwargs: dict):
    """Handle one aten call on spmd tensors (``SpmdTensor.__torch_dispatch__``)."""
    if _CHECKED_INDICES["on"]:  # torchspmd.debug.check_indices(True)
        bounds.check(func, args, kwargs)
    plan = _PLANS.get(id(func))  # _plan, its hit inline
    if plan is None or plan.func is not func:
        plan = _plan(func)
    if plan.special is not None:  # may run a graph: not counted as tracing
        return plan.special(*args, **kwargs)
    data_dependent = plan.data_dependent  # reads a size on the host: not counted either
    if data_dependent is not None and data_dependent.applies(*args, **kwargs):
        return data_dependent.run(*args, **kwargs)
    start = time.perf_counter()
    if plan.inplace_view:
        result = _inplace_view(func, args, kwargs)
    elif plan.mutating:
        result = _mutate(func, plan.schema, args, kwargs)
    elif plan.identity and (not args[0]._h.view or args[0]._h.identity):
        result = _identity_view(func, args)
    elif plan.lowered:
        node = _record_flat(func, plan, _flatten(plan, args, kwargs))
        if plan.view:
            result = _views(func, args, node, plan)
        elif plan.form == "single":  # most ops: one tensor out, no list to build
            meta = node.sig.outputs[0]
            result = None if meta is None else SpmdTensor(Handle.new((node, 0), meta))
        else:
            result = _wrap(func, node)
    else:
        result = _decompose(func, args, kwargs)
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
    SpmdTensor._dispatch = staticmethod(_entry)


_install_entry()


# --- recording -------------------------------------------------------------------------

def _record(func, args, kwargs, plan: _Plan | None = None) -> Node:
    plan = plan or _plan(func)
    return _record_flat(func, plan, _flatten(plan, args, kwargs))


def _record_flat(func, plan: _Plan, flat) -> Node:
    """Record ``func`` from its flattened call (random ops get their seed here)."""
    template, kw_template, inputs, metas, scalars = flat
    if plan.random:
        scalars.append(rng.next_seed())
    COUNTERS["ops_traced"] += 1
    return record(func, template, kw_template, tuple(inputs), tuple(metas), tuple(scalars))


def _flatten(plan: _Plan, args, kwargs):
    """Split a call into its template, tensor values, their metas and scalar inputs."""
    inputs, metas, scalars = [], [], []
    kinds = plan.kinds
    template = []
    plain = _RECORDING[0] is None  # then a base's value is its storage's (Handle.value)
    for i, a in enumerate(args):
        if type(a) is SpmdTensor:  # the common case, without a call to _slot
            handle = a._h
            inputs.append(handle.storage.value if plain and (not handle.view or handle.identity)
                          else handle.value())
            metas.append(handle.meta)
            template.append(TENSOR)
        else:
            template.append(_slot(a, kinds[i] if i < len(kinds) else STATIC, inputs, metas,
                                  scalars))
    kw_template = ()
    if kwargs:
        keyword = plan.keyword
        kw_template = tuple((k, _slot(v, keyword.get(k, STATIC), inputs, metas, scalars))
                            for k, v in kwargs.items() if k not in _DROPPED_KWARGS)
    return tuple(template), kw_template, inputs, metas, scalars


def _slot(arg, kind, inputs, metas, scalars):
    """The template entry for ``arg``, collecting tensor values and scalar inputs."""
    if type(arg) is SpmdTensor or isinstance(arg, SpmdTensor):
        handle = arg._h
        inputs.append(handle.value())
        metas.append(handle.meta)
        return TENSOR
    if kind == STATIC:
        return freeze(arg)
    if kind == TENSORS:  # foreach ops: a list per parameter group, tensors inline
        template = []
        plain = _RECORDING[0] is None  # then a base's value is its storage's (Handle.value)
        for a in arg:
            if type(a) is SpmdTensor:
                handle = a._h
                inputs.append(handle.storage.value if plain and (not handle.view or handle.identity)
                              else handle.value())
                metas.append(handle.meta)
                template.append(TENSOR)
            else:
                template.append(_slot(a, KIND_TENSOR, inputs, metas, scalars))
        return tuple(template)
    if kind == SCALARS:
        return tuple(_slot(a, SCALAR, inputs, metas, scalars) for a in arg)
    slot = _SLOTS.get(type(arg))
    if slot is not None:  # a Python number used as a value: a graph input
        scalars.append(arg)
        return slot
    if isinstance(arg, torch.Tensor):  # a CPU tensor; PyTorch allows 0-d ones with devices
        if arg.dim() != 0:
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               f"least two devices, spmd:0 and {arg.device}!")
        value = _host_value(arg)
        inputs.append(value)
        metas.append(meta_of(value))
        return TENSOR
    return arg


def _wrap(func, node: Node):
    outs = [None if m is None else SpmdTensor(Handle.new((node, i), m))
            for i, m in enumerate(node.sig.outputs)]
    return _shape_result(func, outs)


def _return_form(func) -> str:
    returns = func._schema.returns
    if len(returns) == 1:
        return "list" if str(returns[0].type).startswith("List") else "single"
    return "none" if not returns else "tuple"


def _shape_result(func, outs: list):
    form = _plan(func).form
    if form == "single":
        return outs[0]
    if form == "list":
        return outs
    return None if form == "none" else tuple(outs)


# Signature id -> the view step of a single-output view op: the signature fixes the op
# and its static arguments, so a step's view ops (a few hundred) skip building it.
_VIEW_STEPS: dict[int, object] = {}


def _views(func, args, node: Node, plan: _Plan | None = None):
    """Outputs of view op ``func`` share storage with its input (``x.view(...)``, ``x[0]``)."""
    base = args[0]._h
    static = args[1:]
    sig = node.sig
    outputs = sig.outputs
    if len(outputs) == 1 and (plan or _plan(func)).form == "single":  # view, t, transpose...
        step = _VIEW_STEPS.get(sig.id)
        if step is None:
            step = view_step(func, static)
            if not any(isinstance(a, ScalarSlot) for a in sig.template):  # all static
                _VIEW_STEPS[sig.id] = step
        return SpmdTensor(base.viewed(step, (node, 0), outputs[0]))
    outs = [base.viewed(view_step(func, tuple(static), i), (node, i), m)
            for i, m in enumerate(outputs)]
    return _shape_result(func, [SpmdTensor(h) for h in outs])


def _identity_view(func, args):
    """``x.detach()`` of a base or of an identity view: a handle on the same storage that
    shows its value (no node: the graph would compute and return the same data twice)."""
    base = args[0]._h
    base.value()  # a read, for torchspmd.compile's record of the storages a step touches
    return SpmdTensor(base.viewed(view_step(func, tuple(args[1:])), None, base.meta))


def _host_value(t: torch.Tensor) -> tuple[Node, int]:
    """A leaf holding CPU tensor ``t`` (uploaded when first used)."""
    node = Node.from_host(transfer.to_numpy(t))
    node.sig = leaf_signature(TensorMeta(tuple(t.shape), resize.contiguous_strides(t.shape), t.dtype))
    return (node, 0)


# --- mutation --------------------------------------------------------------------------

def _mutate(func, schema, args, kwargs):
    """``x.add_(y)``, ``torch.add(a, b, out=c)``: record the functional form, then assign."""
    functional = functional_variant(func)
    if functional is None:
        raise _unsupported(func)
    targets = [args[i] for i in schema.mutated] + [kwargs[k] for k in schema.mutated_kw]
    targets = [t for group in targets for t in (group if isinstance(group, (list, tuple)) else [group])]
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
        return _shape_result(func, [SpmdTensor(Handle.new(v, meta_of(v))) for v in extra])
    return _shape_result(func, targets) if _plan(func).form != "none" else None


def _compute_checked(func, functional, args, kwargs, call_kwargs,
                     targets: list) -> list[tuple[Node, int]]:
    """The values ``functional`` computes, after PyTorch's own checks of mutating ``func``.

    The mutating op's meta kernel raises what PyTorch raises (bad casts, shapes); its
    signature is cached, so a training loop pays a dict lookup. An in-place op has the
    same arguments as its functional form, so one flattening serves both. A target's
    value that is only a constraint kept from its previous in-place update is read
    without it (``handle.unkept``): this op's result is constrained again.
    """
    flat = _flatten(_plan(func), args, kwargs)
    template, kw_template, inputs, metas, scalars = flat
    signature(func, template, kw_template, tuple(metas), tuple(scalars))
    plan = _plan(functional)
    if not plan.lowered:
        out = _decompose(functional, args, call_kwargs)
        return [o._h.value() for o in (out if isinstance(out, (list, tuple)) else [out])]
    if call_kwargs.keys() != kwargs.keys():  # out= dropped (or dtype added)
        flat = _flatten(plan, args, call_kwargs)
    _skip_kept(flat[2], targets)
    node = _record_flat(functional, plan, flat)
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
    if handle.view and not handle.identity:
        handle.assign(_keep_annotation(target, value))
        return
    # A base, or an identity view (a parameter): the storage takes the value, with the
    # storage's annotation (all ``Handle.assign`` would do; an optimizer's every write).
    storage = handle.storage
    old = storage.value
    node = old[0]
    if node.arrays is None and node.host is None and node.sig.op in IDENTITY_OPS:
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
    node = _record(functional, args, kwargs)
    meta = node.sig.outputs[0]
    target._h = target._h.viewed(view_step(functional, tuple(args[1:])), (node, 0), meta)
    with torch._C._DisableTorchDispatch():
        torch.ops.aten.as_strided_.default(target, meta.shape, meta.stride)
    return target


_SPECIAL = {
    aten.resize_.default: resize.resize_,
    aten.resize_as_.default: resize.resize_as_,
    **LINALG_COMPOSITES,
}  # and the ops of ``immediate.py``, which registers them


def register_handler(op, handler) -> None:
    """Make ``handler(*args, **kwargs)`` run ``op`` on spmd tensors (for custom ops).

    Lets a package above this one (``sharding/``) implement its own ops without this
    module importing it. Example: ``register_handler(torch.ops.ns.op.default, fn)``.
    """
    _SPECIAL[op] = handler
    _PLANS.pop(id(op), None)


# --- decompositions --------------------------------------------------------------------

# PyTorch's core-ATen decompositions first; its wider table for ops outside the core set.
_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}


def _decompose(func, args, kwargs):
    decomposition = _DECOMPOSITIONS.get(func)
    if decomposition is not None:
        return decomposition(*args, **kwargs)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return func.decompose(*args, **kwargs)
    raise _unsupported(func)


def _unsupported(func) -> NotImplementedError:
    return NotImplementedError(
        f"torchspmd: aten::{func._schema.name.split('::')[-1]}"
        f"{'.' + func._overloadname if func._overloadname != 'default' else ''} is not "
        "supported on the spmd device (no lowering or decomposition). Move the tensor to the "
        "CPU for this op (t.cpu()), or file an issue with the op name.")
