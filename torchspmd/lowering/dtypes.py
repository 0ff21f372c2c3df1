"""PyTorch <-> JAX dtype mapping (explicit, so nothing depends on JAX's defaults)."""

import jax.numpy as jnp
import numpy as np
import torch

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
}
_JAX_TO_TORCH = {np.dtype(j): t for t, j in _TORCH_TO_JAX.items()}
# What to use instead, for dtypes users meet that JAX has no equivalent of.
_INSTEAD = {torch.complex32: "JAX has no 32-bit complex type; use torch.complex64"}


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    """``torch.float32`` -> ``dtype('float32')``; unsupported dtypes raise ``TypeError``.

    Example: ``to_jax_dtype(torch.bfloat16) == jnp.bfloat16``.
    """
    try:
        return np.dtype(_TORCH_TO_JAX[dtype])
    except KeyError:
        hint = f" ({_INSTEAD[dtype]})" if dtype in _INSTEAD else ""
        raise TypeError(f"torchspmd: dtype {dtype} is not supported on the spmd device{hint}"
                        ) from None


def to_torch_dtype(dtype) -> torch.dtype:
    """The inverse of :func:`to_jax_dtype`. Example: ``to_torch_dtype(jnp.int64) == torch.int64``."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"torchspmd: JAX dtype {dtype} has no PyTorch equivalent") from None


_HALF = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def opmath(dtype) -> np.dtype:
    """The dtype PyTorch CPU computes ``dtype`` ops in: float32 for half types, else ``dtype``.

    Example: ``opmath(jnp.bfloat16) == np.float32``; ``opmath(jnp.int64) == np.int64``.
    """
    dtype = np.dtype(dtype)
    return np.dtype(jnp.float32) if dtype in _HALF else dtype
