"""``replication_pad{1,2,3}d_backward`` -> JAX (``F.pad(x, p, mode="replicate")``'s
gradient).

The forward comes from PyTorch's decomposition (index ops); its backward op has none, so
training through replicate padding (audio and image convolutions) failed. The backward
is the ``jax.vjp`` of edge padding written as a gather per padded dim: each border
element's gradient is its own plus that of every copy of it.

Example: ``F.pad(x, (1, 2), mode="replicate").sum().backward()`` gives ``x.grad`` as on
the CPU (``[2, 1, ..., 1, 3]`` along the padded dim).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torchspmd.lowering.dtypes import opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten


def _replicate(x, padding):
    """``x`` edge-padded: ``padding`` lists (before, after) pairs from the last dim
    backward, as ``F.pad`` (a negative amount crops)."""
    for d in range(len(padding) // 2):
        axis = x.ndim - 1 - d
        before, after = padding[2 * d], padding[2 * d + 1]
        size = x.shape[axis]
        x = jnp.take(x, jnp.clip(jnp.arange(-before, size + after), 0, size - 1), axis=axis)
    return x


@lowers(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
        aten.replication_pad3d_backward.default)
def replication_pad_backward(meta, grad_output, x, padding):
    compute = opmath(meta.dtype)
    _, vjp = jax.vjp(lambda a: _replicate(a, tuple(padding)), x.astype(compute))
    return vjp(grad_output.astype(compute))[0].astype(meta.dtype)
