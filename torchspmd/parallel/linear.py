"""An ``nn.Linear`` computed with einsum, so batch dims are never flattened (spec: PyTorch/XLA's
``XLAPatchedLinear``).

``F.linear`` on a ``(batch, seq, in)`` input reaches the device as a reshape to
``(batch * seq, in)``, a matmul and a reshape back: the merged dim mixes the sharded batch
axis with the sequence, which hides the batch sharding from XLA's propagation (worst in the
backward pass, where the weight gradient contracts over that merged dim). Here forward and
backward are each one ``torchspmd::einsum`` op, lowered to one ``dot_general`` over the
original dims. Example::

    model = apply_xla_patch_to_nn_linear(model)        # every nn.Linear -> EinsumLinear
    y = xla_patched_nn_linear_forward(linear, x)       # or one call
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from torch import Tensor, nn

from torchspmd.lowering.dtypes import opmath
from torchspmd.lowering.linalg import precision
from torchspmd.lowering.registry import lowers

__all__ = ["XLAPatchedLinear", "EinsumLinear", "xla_patched_nn_linear_forward",
           "apply_xla_patch_to_nn_linear"]


@torch.library.custom_op("torchspmd::einsum", mutates_args=())
def einsum(equation: str, a: Tensor, b: Tensor) -> Tensor:
    """``torch.einsum(equation, a, b)`` as one op (on the spmd device: one XLA dot).

    Example::

        >>> einsum("...n,mn->...m", torch.ones(2, 3, 4), torch.ones(5, 4)).shape
        torch.Size([2, 3, 5])
    """
    return torch.einsum(equation, a, b)


@einsum.register_fake
def _(equation: str, a: Tensor, b: Tensor) -> Tensor:
    return torch.einsum(equation, a, b)


@lowers(torch.ops.torchspmd.einsum.default)
def _einsum_lowering(meta, equation, a, b):
    # Accumulate as PyTorch does (half types in float32), round once at the end.
    out = jnp.einsum(equation, a, b, precision=precision(meta.dtype),
                     preferred_element_type=opmath(meta.dtype))
    return out.astype(meta.dtype)


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear(input, weight, bias)`` with einsum forward and backward.

    Example::

        >>> y = XLAPatchedLinear.apply(x, linear.weight, linear.bias)
    """

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if input.device.type == "spmd" and torch.is_autocast_enabled("spmd"):
            # As F.linear under autocast (PyTorch/XLA's custom_fwd(cast_inputs=...)):
            # the einsum op is not an autocast op itself, so cast its inputs here.
            dtype = torch.get_autocast_dtype("spmd")
            input, weight = input.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        ctx.save_for_backward(input, weight, bias)
        out = torch.ops.torchspmd.einsum("...n,mn->...m", input, weight)
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.ops.torchspmd.einsum("...m,mn->...n", grad_output, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.ops.torchspmd.einsum("...m,...n->mn", grad_output, input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(dim=tuple(range(grad_output.dim() - 1)))
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Linear, input: Tensor) -> Tensor:
    """``m(input)`` computed by :class:`XLAPatchedLinear`.

    Example::

        >>> y = xla_patched_nn_linear_forward(nn.Linear(4, 5).to("spmd"), x)
    """
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


class EinsumLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is :func:`xla_patched_nn_linear_forward`.

    Example::

        >>> layer = EinsumLinear(4, 5).to("spmd")
    """

    def forward(self, input: Tensor) -> Tensor:
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` by an :class:`EinsumLinear`, in place.

    The new layers take over the old ones' parameter objects (sharding annotations,
    optimizer references and tied weights stay as they were). Returns ``module``; a bare
    ``nn.Linear`` passed as ``module`` is not itself replaced (as in PyTorch/XLA).

    Example::

        >>> model = apply_xla_patch_to_nn_linear(model)
        >>> type(model.fc).__name__
        'EinsumLinear'
    """
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device("meta"):
                patched = EinsumLinear(child.in_features, child.out_features,
                                       bias=child.bias is not None)
            patched.weight = child.weight
            patched.bias = child.bias
            patched.train(child.training)
            setattr(module, name, patched)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module
