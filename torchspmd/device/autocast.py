"""``torch.autocast("spmd")``: mixed precision with CUDA's op lists.

PyTorch ships autocast kernels for CPU, CUDA and a few other devices, but none for the
PrivateUse1 key a Python backend gets (``AutocastPrivateUse1``), so inside
``torch.autocast("spmd")`` every op failed. :func:`install` registers, on that key:

- a fallthrough for every op (ops autocast does not know run unchanged);
- CUDA's lists: matmuls and convolutions run in the autocast dtype (``LOWER_PRECISION``);
  ops that lose too much in 16 bits (``exp``, ``log``, ``softmax``, ``layer_norm``,
  losses, ``sum``...) run in float32 (``FLOAT32``); ops with several tensor inputs of
  different float types run in the widest (``PROMOTE``).

Casts are recorded above autograd, as CUDA's are, so gradients come back in each
parameter's own dtype. Example::

    with torch.autocast("spmd", dtype=torch.bfloat16):
        logits = model(x)            # Linear layers in bfloat16
        loss = F.cross_entropy(logits, y)   # float32
"""

from __future__ import annotations

import torch

from torchspmd.device.tensor import SpmdTensor

__all__ = ["LOWER_PRECISION", "FLOAT32", "PROMOTE", "install"]

_KEY = "AutocastPrivateUse1"

# CUDA's lower_precision_fp list (aten/src/ATen/autocast_mode.cpp).
LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell",
    "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
)

# CUDA's fp32 and fp32_set_opt_dtype lists (the latter compute in float32 too).
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d",
    "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_trilinear3d", "upsample_bicubic2d", "cross_entropy_loss",
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "sum", "sum.dim_IntList",
)

# CUDA's promote list: run in the widest float type among the tensor arguments.
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add", "cat", "stack", "index_copy",
)


def _is_cast_target(x) -> bool:
    # As CUDA's autocast: float tensors of this device, float64 excepted.
    return isinstance(x, SpmdTensor) and x.is_floating_point() and x.dtype != torch.float64


def _cast(value, dtype: torch.dtype):
    if _is_cast_target(value):
        return value if value.dtype == dtype else value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _float_dtypes(value, found: list) -> list:
    if _is_cast_target(value):
        found.append(value.dtype)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _float_dtypes(v, found)
    return found


def _kernel(op, policy: str):
    key = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(key):
            if policy == "lower":
                dtype = torch.get_autocast_dtype("spmd")
            elif policy == "float32":
                dtype = torch.float32
            else:
                dtypes = _float_dtypes((args, kwargs), [])
                if not dtypes:
                    return op(*args, **kwargs)
                dtype = dtypes[0]
                for d in dtypes[1:]:
                    dtype = torch.promote_types(dtype, d)
            return op(*_cast(args, dtype), **_cast(kwargs, dtype))

    return kernel


def _overload(name: str):
    """``aten.<name>`` (``name`` may carry ``.overload``), or ``None`` if this torch lacks it."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


_LIBRARIES: list = []  # keeps the registrations alive


def install() -> None:
    """Register the autocast kernels on ``AutocastPrivateUse1`` (idempotent)."""
    if _LIBRARIES:
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    lists = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER_PRECISION, "lower"), (FLOAT32, "float32"), (PROMOTE, "promote")):
        for name in names:
            op = _overload(name)
            if op is not None:
                lists.impl(name, _kernel(op, policy), _KEY)
    _LIBRARIES.extend([fallback, lists])
