"""Discrete Fourier transforms: ``aten._fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c`` -> ``jnp.fft``.

Every ``torch.fft.*`` function (fft, ifft, rfft, irfft, hfft, ihfft and their 2-d / n-d
forms, any ``norm=``) reaches one of these three primitives after PyTorch's own composite
code has promoted the dtype and padded or trimmed the signal to ``n=`` / ``s=``, so the
lowering only transforms over ``dim`` and scales.

``normalization`` is PyTorch's ``fft_norm_mode``: 0 leaves the transform unscaled, 1
scales by ``1/sqrt(n)``, 2 by ``1/n`` (``n`` the product of the signal sizes). That is
the same whichever direction the transform goes, so it maps onto ``jnp.fft``'s ``norm=``
by direction: a forward transform is unscaled under ``"backward"``, an inverse one under
``"forward"``.

Example: ``torch.fft.rfft(x.to("spmd"), norm="ortho")`` records
``_fft_r2c(x, [-1], 1, True)`` and runs ``jnp.fft.rfftn(x, axes=[-1], norm="ortho")``.
"""

import jax.numpy as jnp
import torch

from torchspmd.lowering.registry import lowers

aten = torch.ops.aten

# fft_norm_mode -> jnp.fft's norm=, for a forward and for an inverse transform.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


def _norm(normalization: int, forward: bool) -> str:
    table = _FORWARD_NORM if forward else _INVERSE_NORM
    if normalization not in table:
        raise ValueError(f"torchspmd: FFT normalization mode {normalization} is not one of "
                         "0 (none), 1 (1/sqrt(n)), 2 (1/n)")
    return table[normalization]


def _axes(dim, ndim: int) -> tuple[int, ...]:
    return tuple(d % ndim for d in dim)


@lowers(aten._fft_c2c.default)
def fft_c2c(meta, x, dim, normalization, forward):
    """Complex-to-complex transform over ``dim`` (``forward`` picks the exponent's sign)."""
    if len(dim) == 0:  # PyTorch returns the input (a copy) for an empty dim list
        return x.astype(meta.dtype)
    axes = _axes(dim, x.ndim)
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    return transform(x, axes=axes, norm=_norm(normalization, forward)).astype(meta.dtype)


@lowers(aten._fft_r2c.default)
def fft_r2c(meta, x, dim, normalization, onesided):
    """Real-to-complex forward transform; ``onesided`` keeps ``n // 2 + 1`` bins of the last dim."""
    axes = _axes(dim, x.ndim)
    norm = _norm(normalization, True)
    if onesided:
        out = jnp.fft.rfftn(x, axes=axes, norm=norm)
    else:
        out = jnp.fft.fftn(x.astype(meta.dtype), axes=axes, norm=norm)
    return out.astype(meta.dtype)


@lowers(aten._fft_c2r.default)
def fft_c2r(meta, x, dim, normalization, last_dim_size):
    """Complex-to-real inverse of a onesided transform; the last dim grows to ``last_dim_size``.

    As in PyTorch (pocketfft), the input is taken to be Hermitian-symmetric: the imaginary
    parts of the bins a real signal cannot have (the zero-frequency bin, and the Nyquist
    bin of an even-length signal) are ignored.
    """
    axes = _axes(dim, x.ndim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm=_norm(normalization, False))
    return out.astype(meta.dtype)
