"""``grid_sampler_2d``/``_3d`` and their backward ops -> JAX.

``F.grid_sample`` (spatial transformers, deformable attention, optical flow) records
``grid_sampler_2d``; its gradient is ``grid_sampler_2d_backward``, which PyTorch has no
decomposition for, so training through ``grid_sample`` failed on this device. Here the
forward is one JAX function (PyTorch's own decomposition, ``torch/_decomp``, written for
any number of spatial dims: bilinear/trilinear, nearest, and bicubic in 2-D), and each
backward op is its ``jax.vjp``: the gradient XLA derives from the same gathers (a
scatter-add into the input; the interpolation weights' derivative for the grid, zero
where a coordinate is clamped by the padding mode, and zero for nearest).

Modes are PyTorch's integers: interpolation 0 bilinear, 1 nearest, 2 bicubic; padding
0 zeros, 1 border, 2 reflection. Half types compute in float32, as on the CPU.

Example: ``F.grid_sample(x, grid, align_corners=False).sum().backward()`` on spmd
tensors gives ``x.grad`` and ``grid.grad`` as on the CPU.
"""

from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import torch

from torchspmd.lowering.dtypes import opmath
from torchspmd.lowering.registry import lowers

aten = torch.ops.aten

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coords, size: int, align_corners: bool):
    """[-1, 1] -> [0, size - 1] (corners aligned) or [-0.5, size - 0.5]."""
    scale = (size * 0.5 - 0.5) if align_corners else size * 0.5
    return coords * scale + (size * 0.5 - 0.5)


def _reflect(coords, twice_low: int, twice_high: int):
    """Reflect coordinates until they fall in [low, high] (bounds given doubled)."""
    if twice_low == twice_high:
        return jnp.zeros_like(coords)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = jnp.abs(coords - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span).astype(jnp.int32)
    return jnp.where(flips % 2 == 0, extra + low, span + low - extra)


def _padded(coords, size: int, padding_mode: int, align_corners: bool):
    """Coordinates moved inside the input as the padding mode says (zeros: unchanged)."""
    if padding_mode == _BORDER:
        return jnp.clip(coords, 0, size - 1)
    if padding_mode == _REFLECTION:
        bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return jnp.clip(_reflect(coords, *bounds), 0, size - 1)
    return coords


def _cubic_weights(t):
    """The four bicubic weights at fraction ``t`` (A = -0.75, PyTorch's)."""
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)


def _sample(x, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """``grid_sampler_{2,3}d(x, grid)`` for ``x`` (N, C, *spatial) and ``grid``
    (N, *out, len(spatial)), whose last axis lists coordinates from the last spatial
    dim to the first (x, y[, z]), as PyTorch's."""
    n, c, *sizes = x.shape
    dims = len(sizes)
    # coordinate arrays per spatial dim, first dim first
    coords = [grid[..., dims - 1 - d] for d in range(dims)]
    lead = (jnp.arange(n).reshape(n, 1, *[1] * dims), jnp.arange(c).reshape(1, c, *[1] * dims))

    def gather(points, weight):
        """``x`` at integer ``points`` (one array per dim) times ``weight``; points
        outside the input read 0."""
        inside = functools.reduce(operator.and_, [(0 <= p) & (p < s)
                                                  for p, s in zip(points, sizes)])
        idx = [jnp.where(inside, p, 0).astype(jnp.int32)[:, None] for p in points]
        w = jnp.where(inside, weight, 0)[:, None]
        return x[(*lead, *idx)] * w

    if interpolation_mode == _BICUBIC:
        # Only 2-D (PyTorch has no 3-D bicubic): 4x4 taps, each coordinate moved inside
        # by the padding mode on its own.
        iy, ix = (_unnormalize(k, s, align_corners) for k, s in zip(coords, sizes))
        y0, x0 = jnp.floor(iy), jnp.floor(ix)
        wy, wx = _cubic_weights(iy - y0), _cubic_weights(ix - x0)
        out = 0
        for i in range(4):
            row = 0
            py = _padded(y0 + (i - 1), sizes[0], padding_mode, align_corners)
            for j in range(4):
                px = _padded(x0 + (j - 1), sizes[1], padding_mode, align_corners)
                row = row + gather((py, px), 1) * wx[j][:, None]
            out = out + row * wy[i][:, None]
        return out
    source = [_padded(_unnormalize(k, s, align_corners), s, padding_mode, align_corners)
              for k, s in zip(coords, sizes)]
    if interpolation_mode == _NEAREST:
        return gather([jnp.round(k) for k in source], 1)
    low = [jnp.floor(k) for k in source]
    out = 0
    for corner in itertools.product((0, 1), repeat=dims):
        weight = 1
        for k, lo, up in zip(source, low, corner):
            weight = weight * ((k - lo) if up else (lo + 1 - k))
        out = out + gather([lo + up for lo, up in zip(low, corner)], weight)
    return out


def _forward(meta, x, grid, interpolation_mode, padding_mode, align_corners):
    compute = opmath(meta.dtype)
    out = _sample(x.astype(compute), grid.astype(compute), interpolation_mode, padding_mode,
                  align_corners)
    return out.astype(meta.dtype)


def _backward(meta, grad_output, x, grid, interpolation_mode, padding_mode, align_corners,
              output_mask):
    compute = opmath(x.dtype)

    def sample(a, g):
        return _sample(a, g, interpolation_mode, padding_mode, align_corners)

    _, vjp = jax.vjp(sample, x.astype(compute), grid.astype(compute))
    grad_x, grad_grid = vjp(grad_output.astype(compute))
    return tuple(None if m is None else g.astype(m.dtype)
                 for m, g in zip(meta, (grad_x, grad_grid)))


lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)(_forward)
lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)(_backward)
