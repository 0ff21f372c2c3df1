"""How one aten call on spmd tensors becomes an IR node: its facts, template and outputs.

``dispatch`` (the entry) and the mutation path both record through here: a call is
flattened into a template (tensors and Python numbers that are graph inputs replaced by
slots), recorded as a node, and its outputs wrapped as spmd tensors (views share their
input's storage). Ops without a lowering use a PyTorch decomposition.

Example::

    node = record_call(aten.add.Tensor, (x, y), {})   # x, y spmd tensors
    out = wrap_outputs(aten.add.Tensor, node)         # a new spmd tensor
"""

from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from torchspmd.device import library_ops, resize
from torchspmd.device.data_dependent import DATA_DEPENDENT
from torchspmd.device.linalg_composites import LINALG_COMPOSITES
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy import provenance
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import IDENTITY_OPS, TENSOR, Node, ScalarSlot, TensorMeta
from torchspmd.lazy.record import freeze, leaf_signature, meta_of, record
from torchspmd.lazy.schema import (EXPONENT, HOST_TENSOR, INDICES, SCALAR, SCALARS, SPECIAL_EXPONENTS, STATIC, TENSORS,
                                   op_schema)
from torchspmd.lazy.schema import TENSOR as KIND_TENSOR
from torchspmd.lazy.views import view_step
from torchspmd.lowering import LOWERINGS, RANDOM_OPS
from torchspmd.runtime import rng, transfer
from torchspmd.runtime.metrics import COUNTERS

aten = torch.ops.aten

_RECORDING = provenance.ACTIVE  # a compiled step being recorded (Handle.value reports reads)

# Ops run by a handler of their own instead of being recorded (``register_handler``).
SPECIAL = {
    aten.resize_.default: resize.resize_,
    aten.resize_as_.default: resize.resize_as_,
    **LINALG_COMPOSITES,
}  # and the ops of ``immediate.py``, which registers them

_SLOTS = {float: ScalarSlot(float), int: ScalarSlot(int), bool: ScalarSlot(bool)}
_DROPPED_KWARGS = ("device", "pin_memory", "layout")  # placement is ours to decide


class OpFacts:
    """What dispatch needs to know about one op, worked out on its first call.

    One dict lookup per call instead of several: hashing an OpOverload runs Python code,
    so facts are found by the op's ``id`` (ops are singletons; ``func`` guards reuse).
    """

    __slots__ = ("func", "special", "data_dependent", "schema", "lowered", "random", "kinds",
                 "keyword", "form", "identity", "inplace_view", "mutating", "view", "plain_view")

    def __init__(self, func):
        self.func = func
        self.special = SPECIAL.get(func)
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
        # A one-output view op whose other arguments are all static (view, t, transpose,
        # select, slice...): a step's most common op, recorded by ``record_view``.
        self.plain_view = (self.view and self.lowered and not self.random and self.form == "single"
                           and bool(self.kinds) and self.kinds[0] == KIND_TENSOR
                           and all(k == STATIC for k in self.kinds[1:]))


FACTS: dict[int, OpFacts] = {}


def op_facts(func) -> OpFacts:
    facts = FACTS.get(id(func))
    if facts is None or facts.func is not func:
        facts = FACTS[id(func)] = OpFacts(func)
    return facts


def record_call(func, args, kwargs, facts: OpFacts | None = None) -> Node:
    facts = facts or op_facts(func)
    return record_flat(func, facts, flatten(facts, args, kwargs))


def record_flat(func, facts: OpFacts, flat) -> Node:
    """Record ``func`` from its flattened call (random ops get their seed here)."""
    template, kw_template, inputs, metas, scalars = flat
    if facts.random:
        scalars.append(rng.next_seed())
    COUNTERS["ops_traced"] += 1
    return record(func, template, kw_template, tuple(inputs), tuple(metas), tuple(scalars))


def record_view(func, facts: OpFacts, args) -> Node:
    """``record_flat(func, facts, flatten(facts, args, {}))`` for a ``facts.plain_view`` op
    whose input is an spmd tensor, without the general flattening: the same template and
    node (a tensor given for a static argument takes the general path)."""
    if len(args) == 1:
        template = _SELF
    else:
        rest = args[1:]
        for a in rest:
            if isinstance(a, torch.Tensor):
                return record_flat(func, facts, flatten(facts, args, {}))
        template = (TENSOR, *[freeze(a) for a in rest])
    handle = args[0]._h
    COUNTERS["ops_traced"] += 1
    return record(func, template, (), (_value(handle, _RECORDING[0] is None),), (handle.meta,))


_SELF = (TENSOR,)


def flatten(facts: OpFacts, args, kwargs):
    """Split a call into its template, tensor values, their metas and scalar inputs."""
    inputs, metas, scalars = [], [], []
    kinds = facts.kinds
    template = []
    plain = _RECORDING[0] is None  # then a base's value is its storage's (Handle.value)
    for i, a in enumerate(args):
        if type(a) is SpmdTensor:  # the common case, without a call to _slot
            handle = a._h
            inputs.append(_value(handle, plain))
            metas.append(handle.meta)
            template.append(TENSOR)
        else:
            template.append(_slot(a, kinds[i] if i < len(kinds) else STATIC, inputs, metas,
                                  scalars))
    kw_template = ()
    if kwargs:
        keyword = facts.keyword
        kw_template = tuple((k, _slot(v, keyword.get(k, STATIC), inputs, metas, scalars))
                            for k, v in kwargs.items() if k not in _DROPPED_KWARGS)
    return tuple(template), kw_template, inputs, metas, scalars


def _value(handle, plain: bool):
    """A tensor's graph value; while no step is recorded (``plain``), a base's or an
    identity view's is its storage's, read without ``Handle.value``'s bookkeeping."""
    return handle.storage.value if plain and (not handle.view or handle.identity) else handle.value()


def _slot(arg, kind, inputs, metas, scalars):
    """The template entry for ``arg``, collecting tensor values and scalar inputs."""
    if type(arg) is SpmdTensor or isinstance(arg, SpmdTensor):
        handle = arg._h
        inputs.append(handle.value())
        metas.append(handle.meta)
        return TENSOR
    if kind == STATIC or (kind == EXPONENT and type(arg) in (int, float)
                          and arg in SPECIAL_EXPONENTS):
        return freeze(arg)
    if kind == TENSORS or kind == INDICES:  # foreach ops' lists; an index op's indices
        template = []
        plain = _RECORDING[0] is None  # then a base's value is its storage's (Handle.value)
        for a in arg:
            if type(a) is SpmdTensor:
                handle = a._h
                inputs.append(_value(handle, plain))
                metas.append(handle.meta)
                template.append(TENSOR)
            elif kind == INDICES and isinstance(a, torch.Tensor) and a.device.type == "cpu":
                # As on CUDA: CPU indices go to the device with the op.
                template.append(_host_input(a, inputs, metas))
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
        if arg.dim() != 0 and kind != HOST_TENSOR:
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               f"least two devices, spmd:0 and {arg.device}!")
        return _host_input(arg, inputs, metas)
    return arg


def _host_input(t: torch.Tensor, inputs: list, metas: list):
    """CPU tensor ``t`` as an input of the op being recorded (``host_value``)."""
    value = host_value(t)
    inputs.append(value)
    metas.append(meta_of(value))
    return TENSOR


def wrap_outputs(func, node: Node):
    outs = [None if m is None else SpmdTensor(Handle.new((node, i), m))
            for i, m in enumerate(node.sig.outputs)]
    return shape_result(func, outs)


def _return_form(func) -> str:
    returns = func._schema.returns
    if len(returns) == 1:
        return "list" if str(returns[0].type).startswith("List") else "single"
    return "none" if not returns else "tuple"


def shape_result(func, outs: list):
    form = op_facts(func).form
    if form == "single":
        return outs[0]
    if form == "list":
        return outs
    return None if form == "none" else tuple(outs)


# Signature id -> the view step of a single-output view op: the signature fixes the op
# and its static arguments, so a step's view ops (a few hundred) skip building it.
_VIEW_STEPS: dict[int, object] = {}


def wrap_views(func, args, node: Node, facts: OpFacts | None = None):
    """Outputs of view op ``func`` share storage with its input (``x.view(...)``, ``x[0]``)."""
    base = args[0]._h
    static = args[1:]
    sig = node.sig
    outputs = sig.outputs
    if len(outputs) == 1 and (facts or op_facts(func)).form == "single":  # view, t, transpose...
        step = _VIEW_STEPS.get(sig.id)
        if step is None:
            step = view_step(func, static)
            if not any(isinstance(a, ScalarSlot) for a in sig.template):  # all static
                _VIEW_STEPS[sig.id] = step
        return SpmdTensor(base.viewed(step, (node, 0), outputs[0]))
    outs = [base.viewed(view_step(func, tuple(static), i), (node, i), m)
            for i, m in enumerate(outputs)]
    return shape_result(func, [SpmdTensor(h) for h in outs])


def identity_view(func, args):
    """``x.detach()`` of a base or of an identity view: a handle on the same storage that
    shows its value (no node: the graph would compute and return the same data twice)."""
    base = args[0]._h
    base.value()  # a read, for torchspmd.compile's record of the storages a step touches
    return SpmdTensor(base.viewed(view_step(func, tuple(args[1:])), None, base.meta))


def host_value(t: torch.Tensor) -> tuple[Node, int]:
    """A leaf holding CPU tensor ``t`` (uploaded when first used)."""
    provenance.read_host(t)
    node = Node.from_host(transfer.to_numpy(t))
    node.sig = leaf_signature(TensorMeta(tuple(t.shape), resize.contiguous_strides(t.shape), t.dtype))
    return (node, 0)


# --- decompositions --------------------------------------------------------------------

# PyTorch's core-ATen decompositions first; its wider table for ops outside the core set.
_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}


def decompose(func, args, kwargs):
    decomposition = _DECOMPOSITIONS.get(func) or library_ops.decomposition(func._schema.name)
    if decomposition is not None:
        return decomposition(*args, **kwargs)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return func.decompose(*args, **kwargs)
    raise unsupported(func)


def unsupported(func) -> NotImplementedError:
    namespace, name = func._schema.name.split('::')
    if namespace == "c10d":  # torch.distributed's collectives
        return NotImplementedError(
            f"torchspmd: torch.distributed's {name.rstrip('_')} does not take spmd tensors. An "
            "spmd tensor is one global value across every process and device: reading it "
            "(.cpu(), .item()) gives that value on every process, so it needs no all_reduce "
            "or broadcast (on a copy, one would count each process's identical value again). "
            "Shard tensors with mark_sharding and XLA inserts the collectives; use CPU "
            "tensors for values that differ between processes. (DistributedDataParallel "
            "calls such collectives: under torchspmd, shard the batch over a mesh axis "
            "instead, or use torchspmd.parallel.SpmdFullyShardedDataParallel.)")
    if "sparse" in name:  # reached by nn.Embedding(sparse=True), torch.sparse
        return NotImplementedError(
            f"torchspmd: aten::{name} makes a sparse tensor; the spmd device holds dense "
            "tensors only. Use dense ones (nn.Embedding(..., sparse=False), "
            "t.to_dense() on the CPU first).")
    return NotImplementedError(
        f"torchspmd: {namespace}::{name}"
        f"{'.' + func._overloadname if func._overloadname != 'default' else ''} is not "
        "supported on the spmd device (no lowering or decomposition). Move the tensor to the "
        "CPU for this op (t.cpu()), or file an issue with the op name.")
