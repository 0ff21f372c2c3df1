"""A tensor's device data as JAX arrays: read it, learn where new data goes, replace it.

What the checkpoint planners need from a tensor, without the lazy IR: its data (running
pending work first), the layout data written into it must take (its annotation's, so a
loaded parameter keeps its sharding), and an in-place swap of its data.

Example::

    (array,) = device_arrays([w])           # jax.Array, sharded as w is
    layout = target_layout(w)               # where w's data lives
    replace_data(w, jax.device_put(array, layout))
"""

from __future__ import annotations

import jax
import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.annotation import annotation
from torchspmd.lazy.handle import Handle
from torchspmd.lazy.node import TensorMeta
from torchspmd.lazy.record import meta_of
from torchspmd.runtime import transfer
from torchspmd.runtime.execute import materialize
from torchspmd.sharding import state

__all__ = ["is_device_tensor", "device_arrays", "target_layout", "replace_data", "tensor_from_array"]


def is_device_tensor(value) -> bool:
    """Whether ``value`` is an spmd tensor (or an ``XLAShardedTensor`` around one).

    >>> is_device_tensor(torch.ones(2))
    False
    """
    return isinstance(getattr(value, "global_tensor", value), SpmdTensor)


def device_arrays(tensors: list[torch.Tensor]) -> list[jax.Array]:
    """The data of ``tensors`` (spmd tensors), computing pending values in one graph.

    With several processes every process must call it with the same tensors (the graph
    runs on every process), in the same order.

    >>> device_arrays([torch.ones(2).to("spmd")])[0].shape  # doctest: +SKIP
    (2,)
    """
    return materialize([state.current_value(state.as_spmd_tensor(t)) for t in tensors])


def _sharding(t: torch.Tensor) -> jax.sharding.Sharding | None:
    """``t``'s annotation, or the layout XLA gave its computed value; ``None`` if neither."""
    return state.jax_sharding_of(state.current_value(state.as_spmd_tensor(t)))


def target_layout(t: torch.Tensor) -> jax.sharding.Sharding:
    """Where data written into ``t`` is stored: as annotated (replicated over the
    annotation's devices if its tiles are uneven), else replicated over every device.

    >>> target_layout(torch.ones(8).to("spmd"))  # doctest: +SKIP
    GSPMDSharding({replicated})
    """
    sharding = _sharding(t)
    if sharding is None:
        return transfer.replicated()
    return state.placement_for(sharding, tuple(t.shape))


def replace_data(t: torch.Tensor, array: jax.Array) -> None:
    """Make ``t`` (and every view of its storage) hold ``array``, keeping its annotation.

    ``array`` must have ``t``'s shape and be laid out as ``target_layout(t)``. As after
    an in-place write, only an annotation stays ``t``'s: a layout XLA chose for an
    unannotated value is where the data lies, not a mark that later computations must
    keep (it would pin them to its devices, e.g. all of them next to a sub-mesh view).

    >>> replace_data(w, loaded)  # doctest: +SKIP
    """
    tensor = state.as_spmd_tensor(t)
    value = state.current_value(tensor)
    if tuple(array.shape) != tuple(t.shape):
        raise ValueError(f"torchspmd: data of shape {tuple(array.shape)} cannot replace a "
                         f"tensor of shape {tuple(t.shape)}")
    tensor.handle.assign(state.new_leaf(meta_of(value), array=array, sharding=annotation(value)))


def tensor_from_array(array: jax.Array, dtype: torch.dtype,
                      sharding: jax.sharding.Sharding | None = None) -> torch.Tensor:
    """A new spmd tensor holding device data ``array`` (of torch dtype ``dtype``),
    annotated with ``sharding`` (reported by ``get_sharding``) if given.

    >>> t = tensor_from_array(jax.numpy.ones(3), torch.float32)  # doctest: +SKIP
    """
    shape = tuple(array.shape)
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    meta = TensorMeta(shape, tuple(reversed(strides)), dtype)
    return SpmdTensor(Handle.new(state.new_leaf(meta, array=array, sharding=sharding), meta))
