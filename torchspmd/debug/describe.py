"""One tensor described for debugging: pending or data, its node, its sharding.

Laid out as PyTorch/XLA's ``_get_xla_tensor_debug_info``, so the lines its users grep
for (``Device: SPMD:0``, ``IR: None``, ``XLAData: None``, ``XLAShardedData``,
``Tensor on host: with size [5, 5]``) mean the same here. Example::

    >>> print(tensor_debug_info(torch.randn(5, 5).to("spmd")))   # doctest: +SKIP
    XLATensor {
    TensorID: 140245...
    Device: SPMD:0
    XLA Shape: f32[5,5]
    ShardingSpec: None
    IR: None
    XLAData: None
    Tensor on host: with size [5, 5]
    }
"""

from __future__ import annotations

import torch

from torchspmd.lazy.node import Node
from torchspmd.runtime.graph import collect
from torchspmd.sharding import state
from torchspmd.sharding.hlo_text import REPLICATED_TEXT, sharding_to_hlo_text

__all__ = ["tensor_debug_info", "xla_shape"]

_XLA_TYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "s64", torch.int32: "s32", torch.int16: "s16", torch.int8: "s8",
    torch.uint8: "u8", torch.bool: "pred", torch.complex64: "c64", torch.complex128: "c128",
}


def xla_shape(dtype: torch.dtype, shape) -> str:
    """XLA's spelling of a shape, as PyTorch/XLA prints it.

    >>> xla_shape(torch.float32, (2, 3))
    'f32[2,3]'
    """
    return f"{_XLA_TYPES.get(dtype, str(dtype))}[{','.join(str(int(d)) for d in shape)}]"


def _op_name(node: Node) -> str:
    op = node.sig.op
    schema = getattr(op, "_schema", None)
    if schema is None:  # torchspmd's annotation pseudo-ops
        return f"torchspmd::{op.__name__}"
    overload = op._overloadname
    return schema.name + ("" if overload == "default" else f".{overload}")


def _ir(value) -> str:
    node, index = value
    if node.is_leaf:
        return "None"
    meta = node.sig.outputs[index]
    pending = len(collect([node]).nodes)
    return (f"[] {_op_name(node)}, xla_shape={xla_shape(meta.dtype, meta.shape)}, "
            f"output={index}, pending_nodes={pending}")


def _data(value, shape: str, spec: str) -> str:
    node, index = value
    if node.arrays is None:
        return "XLAData: None\n"
    array = node.arrays[index]
    held = sharding_to_hlo_text(array.sharding, array.ndim)
    if spec not in ("", REPLICATED_TEXT):
        return (f"XLAShardedData: \n  Data Device: SPMD:0\n  Data Shape: {shape}\n"
                f"  OpSharding: {spec}\n  NumShards: {len(array.sharding.device_set)}\n"
                + (f"  Stored as: {held}\n" if held != spec else ""))
    devices = sorted(d.id for d in array.sharding.device_set)
    return (f"XLAData: \n  Data Device: SPMD:0\n  Data Shape: {shape}\n"
            f"  Devices: {devices}\n")


def tensor_debug_info(t: torch.Tensor) -> str:
    """A description of ``t``'s lazy state, as PyTorch/XLA's ``_get_xla_tensor_debug_info``.

    ``IR`` names the op of a pending value (and how many pending nodes its graph has),
    or ``None`` for data; ``XLAData``/``XLAShardedData`` describe device data;
    ``Tensor on host`` is CPU data not uploaded yet. Runs and uploads nothing.

    Example::

        >>> "aten::mul.Tensor" in tensor_debug_info(x * 2)
        True
    """
    inner = state.as_spmd_tensor(t, "tensor_debug_info")
    value = inner.handle.value()
    node, _ = value
    shape = xla_shape(inner.dtype, inner.shape)
    spec = state.current_text(inner)
    host = "None" if node.host is None else f"with size {list(node.host.shape)}"
    return (f"XLATensor {{\nTensorID: {id(inner.handle.storage)}\nDevice: SPMD:0\n"
            f"XLA Shape: {shape}\nShardingSpec: {spec or 'None'}\nIR: {_ir(value)}\n"
            f"{_data(value, shape, spec)}Tensor on host: {host}\n}}\n")
