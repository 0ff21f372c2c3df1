"""``scan_layers``: a stack of identical layers compiled once, through ``jax.lax.scan``.

PyTorch/XLA's ``scan_layers`` semantics: ``layers`` is a homogeneous sequence (same class,
same parameter and buffer names, shapes and dtypes); each layer maps the hidden state to a
new hidden state of the same shape. The result equals ``for layer in layers: h = layer(h)``,
but XLA compiles one layer body instead of ``len(layers)`` copies of it.

Route, and why: one layer's forward is recorded on placeholder spmd tensors
(``interop.trace``: the device's own recording and lowering table, so every op the device
runs works here, sharding constraints included), and the scan over the stacked parameters
becomes one :class:`~torchspmd.interop.call_jax.JaxOp` node. Its gradient is ``jax.vjp`` of
the scan (a reverse scan), reusing call_jax's autograd; by default the body is
``jax.checkpoint``-ed, so the reverse scan recomputes each layer from its input rather
than reading residuals stacked by the forward scan (faster to compile and to run on
XLA:CPU). The parameters enter as a stack of the layers' own parameters
(``layer_stack.stack_layers``), so autograd delivers each layer's row of the stacked
gradient to that layer's ``.grad``; a stacked parameter is sharded as the first layer's
parameter was, with the layer axis unsharded.

Limits (each raises a clear error): no random ops in the layers (dropout), no in-place
updates of buffers, no manual-sharding regions; tensors the layer captures from outside
its parameters and input enter as constants without gradients.

Example::

    layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(16)).to("spmd")
    h = torchspmd.scan_layers(layers, h)       # same value as the Python loop
    loss(h).backward()                         # layers[i].weight.grad as usual
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torch import nn
from torch.func import functional_call

from torchspmd.device import index_checks
from torchspmd.device.tensor import SpmdTensor
from torchspmd.interop.jax_autograd import apply
from torchspmd.interop.jax_op import JaxOp
from torchspmd.interop.trace import TracedFunction, trace
from torchspmd.parallel.layer_stack import stack_layers
from torchspmd.runtime.metrics import COUNTERS

__all__ = ["scan_layers"]

# (TracedFunction.key, checkpoint) -> the scan op over that body (one program per body).
_SCANS: dict[tuple, ScanOp] = {}


class ScanOp(JaxOp):
    """``(hidden, *stacked, *constants) -> hidden``: ``body`` scanned over the stack's axis 0.

    With ``checkpoint`` the body is ``jax.checkpoint``-ed: the gradient's reverse scan
    recomputes each layer's forward from the layer's input instead of reading residuals
    that the forward scan saved (see :func:`scan_layers`).
    """

    def __init__(self, body: TracedFunction, stacked: int, constants: int, checkpoint: bool):
        super().__init__(f"scan_layers({stacked} stacked tensors)")
        self.body, self.stacked, self.checkpoint = body, stacked, checkpoint
        self.count = 1 + stacked + constants

    @classmethod
    def get(cls, body: TracedFunction, stacked: int, constants: int,
            checkpoint: bool) -> ScanOp:
        key = (body.key, checkpoint)
        op = _SCANS.get(key)
        if op is None:
            op = _SCANS[key] = cls(body, stacked, constants, checkpoint)
        return op

    def flat(self, hidden, *arrays) -> list:
        stacked, constants = list(arrays[: self.stacked]), list(arrays[self.stacked:])

        def step(carry, layer):
            COUNTERS["scan_body_traces"] += 1  # Python runs here only while JAX traces
            h, flag = carry
            out, *checks = self.body.replay([*layer, h], constants)
            if checks:  # the first layer's failing check is the one reported
                flag = jnp.where(flag == 0, checks[0], flag)
            return (out, flag), None

        if self.checkpoint:  # prevent_cse=False: scan already keeps XLA from merging it away
            step = jax.checkpoint(step, prevent_cse=False)
        (out, flag), _ = jax.lax.scan(step, (hidden, jnp.zeros((), jnp.int32)), stacked)
        return [out, flag] if self.body.checks else [out]

    def _infer(self, structs) -> tuple[list, Any]:
        leaves = [jax.ShapeDtypeStruct(*structs[0])]
        if self.body.checks:  # the index checks' flag (``TracedFunction.checks``)
            leaves.append(jax.ShapeDtypeStruct((), jnp.int32))
        return leaves, jax.tree_util.tree_structure(leaves)


def scan_layers(layers: Iterable[nn.Module], input_data: torch.Tensor, *,
                checkpoint: bool = True) -> torch.Tensor:
    """``input_data`` through every layer in order, compiled as one ``lax.scan``.

    Args:
      layers: modules of one class with identical parameter/buffer names, shapes and
        dtypes (an ``nn.ModuleList`` of decoder layers), on the spmd device. Each maps a
        tensor to a tensor of the same shape and dtype.
      input_data: the hidden state entering the first layer (spmd tensor).
      checkpoint: recompute each layer's forward in the backward pass, keeping only the
        layers' inputs (activation checkpointing per layer). The default: on XLA:CPU it
        compiles faster and runs faster than saving every residual (writing residuals
        into stacked buffers in the forward loop and reading them back costs more than
        recomputing), and it holds less memory. ``False`` saves the residuals, as
        PyTorch/XLA's default partition does: no recomputation, for hardware where
        the layer's FLOPs dominate. Values are the same either way.

    Example::

        >>> h = torchspmd.scan_layers(model.layers, model.embed(tokens))
    """
    layers = list(layers)
    if not layers:
        raise ValueError("torchspmd: scan_layers needs at least one layer.")
    names = _check_homogeneous(layers)
    if not isinstance(input_data, SpmdTensor):
        raise TypeError(f"torchspmd: scan_layers input is a tensor on {input_data.device}; "
                        "move it to the spmd device first (t.to('spmd')).")
    first = layers[0]
    per_layer = [_named_tensors(layer) for layer in layers]
    stacked = [stack_layers([tensors[n] for tensors in per_layer]) for n in names]

    def body(*tensors):
        *params, h = tensors
        return functional_call(first, dict(zip(names, params)), (h,))

    metas = [per_layer[0][n].handle.meta for n in names] + [input_data.handle.meta]
    traced, constants, outs = trace(body, metas, caller="scan_layers")
    if len(outs) != 1 or outs[0] != input_data.handle.meta:
        raise ValueError(
            f"torchspmd: scan_layers: a layer must return one tensor of its input's shape and "
            f"dtype {tuple(input_data.shape)} {input_data.dtype}; it returned "
            f"{[(m.shape, m.dtype) for m in outs]}.")
    op = ScanOp.get(traced, len(stacked), len(constants), checkpoint)
    out, *checks = apply(op, [input_data, *stacked, *constants])
    if checks:
        index_checks.fold(checks[0], traced.checks)
    return out


def _named_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(layer.named_parameters()), **dict(layer.named_buffers())}


def _check_homogeneous(layers: list[nn.Module]) -> list[str]:
    """The tensor names every layer has; a clear error for layers that differ."""
    def layout(layer):
        return [(n, tuple(t.shape), t.dtype) for n, t in _named_tensors(layer).items()]

    first = layout(layers[0])
    for i, layer in enumerate(layers[1:], start=1):
        if type(layer) is not type(layers[0]) or layout(layer) != first:
            raise ValueError(
                f"torchspmd: scan_layers needs identical layers; layer {i} "
                f"({type(layer).__name__}) differs from layer 0 ({type(layers[0]).__name__}) "
                "in class or in parameter/buffer names, shapes or dtypes.")
    for name, t in _named_tensors(layers[0]).items():
        if not isinstance(t, SpmdTensor):
            raise TypeError(f"torchspmd: scan_layers: {name} is on {t.device}; move the "
                            "layers to the spmd device first (layers.to('spmd')).")
    return [n for n, _, _ in first]

