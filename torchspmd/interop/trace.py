"""A PyTorch function recorded once on placeholder tensors, replayed as a JAX function.

``scan_layers`` needs one layer's forward as a JAX function of its parameters and input.
The spmd device already records every op as a lazy IR node whose lowering is a pure JAX
function, so the simplest faithful route is to run the layer on *placeholder* spmd tensors
(nodes that hold no data), walk the recorded nodes back from the outputs, and replay them
through the lowering table, exactly as a compiled step does. Everything the device
supports (decompositions, views, in-place ops, sharding constraints) works unchanged.

Values the function reads that are not placeholders (captured tensors) become extra
inputs (``constants``); Python numbers recorded as graph inputs are baked in (they are
part of :attr:`TracedFunction.key`, so a changed number gives a new key).

Example::

    traced, constants = trace(lambda w, x: x @ w, [w_meta, x_meta])
    (y,) = traced.replay([w_array, x_array], [c.handle.value() for c in constants])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchspmd.device import index_checks
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import PENDING, Handle
from torchspmd.lazy.node import Node, Signature, TensorMeta
from torchspmd.lowering import RANDOM_OPS
from torchspmd.lowering.annotation_ops import FULL_TO_SHARD, SHARD_TO_FULL, AnnotationOp
from torchspmd.lowering.registry import lowers
from torchspmd.runtime.program import lower_node

__all__ = ["TracedFunction", "trace"]

# A placeholder's op: it is never lowered by a traced function's replay; a step that
# reaches it (the function read a value while being traced) gets this error.
PLACEHOLDER = AnnotationOp("placeholder")


@lowers(PLACEHOLDER)
def _placeholder(meta, *args):
    raise RuntimeError("torchspmd: a value was read (.item(), print, .cpu()) while a function "
                       "was being traced to run on the device (scan_layers' layer, generate's "
                       "decode step); a traced function must not read its tensors' values on "
                       "the host.")


@dataclass(frozen=True)
class TracedFunction:
    """The recorded ops of a function: ``steps`` of ``(signature, operands, scalars)``.

    An operand is ``("step", position, output)``, ``("input", k)`` or ``("constant", k)``;
    ``outputs`` are operands too. ``key`` is structural: equal keys, equal computations.

    ``checks``: the messages of the function's index checks (``device/index_checks.py``),
    when it has any; the last output is then their flag, an int32 scalar (0, or the number
    of the message of the first indexing op whose index was out of range). The caller
    hands it on (``index_checks.fold``): XLA never faults on an index, and a traced body
    must not lose the error the same ops raise elsewhere.
    """

    steps: tuple
    outputs: tuple
    key: tuple
    checks: tuple[str, ...] = ()

    def replay(self, inputs: list, constants: list) -> list:
        """The function's outputs for JAX values ``inputs`` and ``constants``."""
        values: list = []

        def get(code):
            kind, a, *rest = code
            if kind == "step":
                return values[a][rest[0]]
            return inputs[a] if kind == "input" else constants[a]

        for sig, operands, scalars in self.steps:
            values.append(lower_node(sig, [get(c) for c in operands], list(scalars)))
        return [get(c) for c in self.outputs]


def trace(fn: Callable[..., torch.Tensor | tuple], metas: list[TensorMeta],
          caller: str = "trace", mutable: int = 0
          ) -> tuple[TracedFunction, list[SpmdTensor], list[TensorMeta]]:
    """Record ``fn`` on placeholders of ``metas``; its traced form, constants, output metas.

    ``fn`` returns a tensor or a tuple of tensors. It runs with autograd off: the traced
    function is differentiated by JAX, not by PyTorch. The first ``mutable`` inputs may be
    updated in place (``fn`` returns them to make their new values outputs: a loop body
    carrying its state, ``generation/device_loop.py``); any other input may not.
    """
    placeholders = [_placeholder_tensor(m) for m in metas]
    # Before ``fn`` runs: an input updated in place then holds a new node.
    index = {p.handle.stored_node(): k for k, p in enumerate(placeholders)}
    mark = PENDING.members()
    outside = index_checks.take_flag()  # the function's index checks are its own
    checks = None
    try:
        with torch.no_grad():
            out = fn(*placeholders)
        checks = index_checks.take_flag()
    finally:
        index_checks.restore_flag(outside)
        # What the function computed is the traced body's, not work for the next sync(),
        # even where a value outlives the trace (held by a module, or by the traceback of
        # an error it raised): its nodes read placeholders, which hold no data.
        PENDING.drop_new(mark)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for i, o in enumerate(outs):
        if not isinstance(o, SpmdTensor):
            raise TypeError(f"torchspmd: {caller}: output {i} is {type(o).__name__}, not a "
                            "tensor on the spmd device.")
    for i, p in enumerate(placeholders[mutable:], mutable):
        if p.handle.stored_node().sig.op is not PLACEHOLDER:
            raise NotImplementedError(
                f"torchspmd: {caller}: input {i} was modified in place while traced (a "
                "buffer update such as BatchNorm's running statistics?); traced layers must "
                "not mutate their inputs, parameters or buffers.")
    roots = [o.handle.value() for o in outs]
    if checks is not None:
        roots.append(checks.tensor.handle.value())
    traced, constants = _walk(roots, index, caller,
                              tuple(checks.messages) if checks is not None else ())
    return traced, constants, [o.handle.meta for o in outs]


def _placeholder_tensor(meta: TensorMeta) -> SpmdTensor:
    node = Node(Signature(-1, PLACEHOLDER, (), (), (meta,)))
    handle = Handle.new((node, 0), meta)
    PENDING.discard(handle.storage)  # nothing to compute: a sync must not see it
    return SpmdTensor(handle)


def _walk(roots: list, placeholders: dict, caller: str, checks: tuple[str, ...]):
    """The steps ``roots`` need, operands first, with data leaves as constants."""
    position: dict[Node, int] = {}
    constants: dict[tuple, int] = {}
    steps: list = []
    key: list = []

    def code(value):
        node, i = value
        if node in placeholders:
            return ("input", placeholders[node])
        if node.is_leaf:
            return ("constant", constants.setdefault(value, len(constants)))
        return ("step", position[node], i)

    for root, _ in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position or node in placeholders or node.is_leaf:
                stack.pop()
                continue
            waiting = [n for n, _ in node.inputs
                       if n not in position and n not in placeholders and not n.is_leaf]
            if waiting:
                stack.extend(waiting)
                continue
            stack.pop()
            _check_op(node.sig.op, caller)
            operands = tuple(code(v) for v in node.inputs)
            position[node] = len(steps)
            steps.append((node.sig, operands, tuple(node.scalars)))
            key.append((node.sig.id, operands, tuple(node.scalars)))
    outputs = tuple(code(v) for v in roots)
    constant_values = sorted(constants, key=constants.get)
    key.append(outputs)
    key.append(tuple(v[0].sig.outputs[v[1]] for v in constant_values))
    key.append(checks)
    tensors = [SpmdTensor(Handle.new(v, v[0].sig.outputs[v[1]])) for v in constant_values]
    return TracedFunction(tuple(steps), outputs, tuple(key), checks), tensors


def _check_op(op, caller: str) -> None:
    if op in RANDOM_OPS:
        raise NotImplementedError(
            f"torchspmd: {caller}: {op} draws random numbers, which a traced layer cannot "
            "do yet (every layer would reuse one key). Disable dropout in the scanned "
            "layers (p=0 or model.eval()), or do not scan them.")
    if op is FULL_TO_SHARD or op is SHARD_TO_FULL:
        raise NotImplementedError(
            f"torchspmd: {caller}: manual-sharding regions inside a traced layer are not "
            "supported; call the layer's shard_map kernel through call_jax instead.")
