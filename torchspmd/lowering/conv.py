"""Convolution and pooling lowerings, forward and backward.

``F.conv1d/2d/3d`` and ``conv_transpose*`` (padding="same" included) reach ``convolution``;
``max_pool1d``/``avg_pool1d`` reach the 2-d pooling ops through unsqueeze. Backward ops are
``jax.vjp`` of the forward lowering (XLA drops the parts ``output_mask`` does not ask for),
except max pooling, whose backward scatters into the argmax ``indices`` PyTorch saved.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.linalg import precision
from torchspmd.lowering.registry import lowers

aten = ops.aten


def _tup(v, n):
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * n if len(v) == 1 else v)


def _outs(meta, values):
    return tuple(None if m is None else v.astype(m.dtype) for m, v in zip(meta, values))


# ---------------------------------------------------------------- convolution


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, dtype):
    """Convolution of batched ``x`` (N, C, *spatial) by ``w`` without bias, accumulated in opmath."""
    nd = w.ndim - 2
    stride, padding, dilation = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    sp = "DHW"[-nd:] if nd <= 3 else None
    dn = ("NC" + sp, "OI" + sp, "NC" + sp)
    x, w = x.astype(dtype), w.astype(dtype)
    kw = dict(dimension_numbers=dn, feature_group_count=groups, precision=precision(dtype),
              preferred_element_type=opmath(dtype), rhs_dilation=dilation)
    # XLA:GPU has no integer convolutions (cuDNN's are int8 only; JAX's UNIMPLEMENTED
    # error): integer ones are the same sums as matmuls, on every backend alike.
    integer = not jnp.issubdtype(dtype, jnp.inexact)
    if not transposed and (groups > 1 or integer):
        return _grouped_conv(x, w, stride, padding, dilation, groups, dtype)
    if not transposed:
        return jax.lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding], **kw)
    # A transposed convolution is the input-gradient of a convolution: dilate the input by
    # the stride and convolve with the flipped kernel, (Cin, Cout/g, k) -> (Cout, Cin/g, k).
    cin, cout_g, k = w.shape[0], w.shape[1], w.shape[2:]
    w = w.reshape((groups, cin // groups, cout_g) + k).swapaxes(1, 2).reshape((groups * cout_g, cin // groups) + k)
    w = jnp.flip(w, tuple(range(2, w.ndim)))
    op = _tup(output_padding, nd)
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + o) for kk, p, d, o in zip(k, padding, dilation, op)]
    if integer or (groups == 1 and any(s > 1 for s in stride) and jax.default_backend() == "cpu"):
        # XLA:CPU's algebraic simplifier swaps the operands of some input-dilated
        # convolutions into an invalid one and aborts the process (plain-JAX repro:
        # tests/lowering/test_xla_conv_bugs.py). Dilating with an interior pad first gives
        # it a plain stride-1 convolution, which it leaves alone; same values. The abort
        # was seen on ungrouped convolutions only; grouped ones reach here only as
        # transposed convolutions and keep XLA's input dilation, as before.
        zero = np.zeros((), x.dtype)
        x = jax.lax.pad(x, zero, [(0, 0, 0)] * 2 + [(lo, hi, s - 1) for (lo, hi), s in zip(pads, stride)])
        pads, stride = [(0, 0)] * nd, (1,) * nd
        if integer:  # now a plain stride-1 convolution: as matmuls (see above)
            return _grouped_conv(x, w, stride, (0,) * nd, dilation, groups, dtype)
    return jax.lax.conv_general_dilated(x, w, (1,) * nd, pads, lhs_dilation=stride, **kw)


def _input_grad(gy, w, input_shape, stride, padding, dilation, groups, dtype):
    """The input gradient of a (not transposed) convolution: the transposed convolution of
    ``gy`` by the same weight, with the output padding that gives back ``input_shape``
    (as PyTorch defines ``conv_transpose``). ``jax.vjp`` would build the same convolution;
    building it here lets ``_conv`` route around XLA:CPU's abort on input dilation."""
    nd = w.ndim - 2
    stride, padding, dilation = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    # The rows the forward's last window did not reach: (n + 2p - d(k-1) - 1) mod s.
    output_padding = [(n + 2 * p - d * (k - 1) - 1) % s
                      for n, p, d, k, s in zip(input_shape[2:], padding, dilation, w.shape[2:], stride)]
    return _conv(gy, w, stride, padding, dilation, True, output_padding, groups, dtype)


@lowers(aten.convolution.default)
def convolution(meta, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups, meta.dtype)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out.astype(meta.dtype)


def _kernel_windows(x, kernel, stride, padding, dilation, out, groups, dtype):
    """``(offset, window)`` per kernel offset: the input elements that offset multiplies
    at every output position, as (N, groups, C/groups, positions)."""
    n, c = x.shape[0], x.shape[1]
    # Zero padding: ``padding`` below, and above as far as the last window reaches.
    high = [max(0, (k - 1) * d + (p_ - 1) * s + 1 - (size + pad))
            for k, d, p_, s, size, pad in zip(kernel, dilation, out, stride, x.shape[2:], padding)]
    xp = jnp.pad(x.astype(dtype), [(0, 0), (0, 0)] + [(pad, h) for pad, h in zip(padding, high)])
    for offset in np.ndindex(*kernel):
        start = [k * d for k, d in zip(offset, dilation)]
        limit = [st + (p_ - 1) * s + 1 for st, p_, s in zip(start, out, stride)]
        window = jax.lax.slice(xp, [0, 0] + start, [n, c] + limit, [1, 1] + list(stride))
        yield offset, window.reshape((n, groups, c // groups, -1))


def _grouped_conv(x, w, stride, padding, dilation, groups, dtype):
    """``y[n, o, p] = sum_{c, k} xpad[n, group(o) * C/g + c, p * stride + k * dilation] * w[o, c, k]``.

    A grouped convolution as one batched matmul per kernel offset. XLA's SPMD partitioner
    turns a grouped convolution whose input channels are split into more shards than there
    are groups into an invalid one (plain JAX reproduces it:
    ``tests/lowering/test_xla_conv_bugs.py``); einsums over (group, channel) it partitions
    like any other. ``jax.vjp`` of this form gives the input gradient the same way.
    """
    nd = w.ndim - 2
    o, k = w.shape[0], w.shape[2:]
    out = [(size + 2 * p - d * (kk - 1) - 1) // s + 1
           for size, p, d, kk, s in zip(x.shape[2:], padding, dilation, k, stride)]
    wg = w.astype(dtype).reshape((groups, o // groups, w.shape[1]) + tuple(k))
    y = sum(jnp.einsum("ngcp,goc->ngop", window, wg[(Ellipsis,) + offset], precision=precision(dtype),
                       preferred_element_type=opmath(dtype))
            for offset, window in _kernel_windows(x, k, stride, padding, dilation, out, groups, dtype))
    return y.reshape((x.shape[0], o) + tuple(out))


def _grouped_weight_grad(x, gy, kernel, stride, padding, dilation, groups, dtype):
    """``dw[o, c, k] = sum_{n, p} xpad[n, group(o) * C/g + c, p * stride + k * dilation] * gy[n, o, p]``.

    The weight gradient of a grouped convolution, (O, C/g, *kernel), as one batched matmul per
    kernel offset. ``jax.vjp`` would give a convolution with ``batch_group_count = groups``,
    and XLA's SPMD partitioner miscompiles that one when the batch is sharded (plain JAX
    reproduces it: ``tests/sharding/test_grouped_conv_sharded.py``). Here the batch is a
    contraction dim of an einsum, which the partitioner turns into partial sums and one
    all-reduce of the (small) weight gradient, as for an ungrouped convolution.
    """
    n, c, o = x.shape[0], x.shape[1], gy.shape[1]
    g = gy.astype(dtype).reshape((n, groups, o // groups, -1))
    grads = [jnp.einsum("ngcp,ngop->goc", window, g, precision=precision(dtype),
                        preferred_element_type=opmath(dtype))
             for _, window in _kernel_windows(x, kernel, stride, padding, dilation, gy.shape[2:], groups, dtype)]
    return jnp.stack(grads, axis=-1).reshape((o, c // groups) + tuple(kernel))


@lowers(aten.convolution_backward.default)
def convolution_backward(meta, grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    acc = opmath(input.dtype)
    g = grad_output.astype(acc)
    conv = lambda x, w: _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, acc)
    if transposed or groups > 1:  # a strided convolution, or the grouped einsums' own vjp
        gx = jax.vjp(lambda x: conv(x, weight), input.astype(acc))[1](g)[0]
    else:
        gx = _input_grad(g, weight.astype(acc), input.shape, stride, padding, dilation, groups, acc)
    if groups == 1:
        gw = jax.vjp(lambda w: conv(input, w), weight.astype(acc))[1](g)[0]
    else:
        nd = weight.ndim - 2
        args = (weight.shape[2:], _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd), groups, acc)
        # A transposed convolution's weight gradient is a convolution's, with input and
        # output gradient in each other's places: (Cin, Cout/g, *k).
        gw = _grouped_weight_grad(g, input, *args) if transposed else _grouped_weight_grad(input, g, *args)
    return _outs(meta, (gx, gw, jnp.sum(g, (0,) + tuple(range(2, g.ndim)))))


# ---------------------------------------------------------------- pooling


def _pool_size(n, k, s, p, d, ceil_mode):
    """Output length of a pooling window over ``n`` (PyTorch's pooling_output_shape)."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _windows(n, k, s, p, d, ceil_mode):
    """(positions (out, k) clipped into range, valid mask (out, k)) of a strided window."""
    out = _pool_size(n, k, s, p, d, ceil_mode)
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return np.clip(pos, 0, n - 1), (pos >= 0) & (pos < n)


def _adaptive_windows(n, out):
    """Adaptive pooling windows: [floor(i*n/out), ceil((i+1)*n/out)) as (positions, valid)."""
    start = (np.arange(out) * n) // out
    end = -((-(np.arange(out) + 1) * n) // out)
    pos = start[:, None] + np.arange((end - start).max())[None, :]
    return np.minimum(pos, n - 1), pos < end[:, None]


def _max_pool(x, rows, cols):
    """Max over 2-d windows and the flat per-plane index (h * W + w) of the first maximum."""
    (r, rv), (c, cv) = rows, cols
    w = x.shape[-1]
    vals = x[..., r, :][..., c]  # (..., OH, KH, OW, KW)
    vals = jnp.moveaxis(vals, -3, -2)  # (..., OH, OW, KH, KW)
    valid = rv[:, None, :, None] & cv[None, :, None, :]
    flat = (r[:, None, :, None] * w + c[None, :, None, :])
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    vals = jnp.where(valid, vals, jnp.asarray(lowest, x.dtype)).reshape(vals.shape[:-2] + (-1,))
    arg = jnp.argmax(vals, axis=-1)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(flat.reshape(flat.shape[:2] + (-1,)), vals.shape)
    return out, jnp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]


def _scatter_to_planes(grad_output, self, indices, dtype):
    """Sum each gradient into its input position (flat per-plane index), as max-pool backward."""
    lead, hw = self.shape[:-2], self.shape[-2] * self.shape[-1]
    b = int(np.prod(lead, dtype=np.int64))
    g = grad_output.astype(dtype).reshape(b, -1)
    idx = indices.reshape(b, -1)
    out = jnp.zeros((b, hw), dtype).at[jnp.arange(b)[:, None], idx].add(g)
    return out.reshape(self.shape)


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(meta, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, p, d = _tup(kernel_size, 2), _tup(padding, 2), _tup(dilation, 2)
    s = _tup(stride, 2) if stride else k  # an empty stride means the kernel size
    h, w = self.shape[-2:]
    out, idx = _max_pool(self, _windows(h, k[0], s[0], p[0], d[0], ceil_mode),
                         _windows(w, k[1], s[1], p[1], d[1], ceil_mode))
    return _outs(meta, (out, idx))


@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(meta, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_to_planes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(meta, self, output_size):
    (h, w), (oh, ow) = self.shape[-2:], _tup(output_size, 2)
    return _outs(meta, _max_pool(self, _adaptive_windows(h, oh), _adaptive_windows(w, ow)))


@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(meta, grad_output, self, indices):
    return _scatter_to_planes(grad_output, self, indices, opmath(meta.dtype)).astype(meta.dtype)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              dims: int):
    """Average pooling over the last ``dims`` dims, with PyTorch's output sizes and divisors."""
    k, p = _tup(kernel_size, dims), _tup(padding, dims)
    s = _tup(stride, dims) if stride else k  # an empty stride means the kernel size
    size = x.shape[-dims:]
    outs = [_pool_size(n, kk, ss, pp, 1, ceil_mode) for n, kk, ss, pp in zip(size, k, s, p)]
    # Zero padding, on the high side as far as the last (ceil_mode) window reaches.
    pads = [(pp, (o - 1) * ss + kk - n - pp, 0) for n, kk, ss, pp, o in zip(size, k, s, p, outs)]
    zero = np.zeros((), x.dtype)  # a concrete 0 keeps reduce_window a (differentiable) window sum
    xp = jax.lax.pad(x, zero, [(0, 0, 0)] * (x.ndim - dims) + pads)
    lead = (1,) * (x.ndim - dims)
    total = jax.lax.reduce_window(xp, zero, jax.lax.add, lead + k, lead + s, "VALID")
    if divisor_override:
        return total / divisor_override
    counts = []
    for n, kk, ss, pp, o in zip(size, k, s, p, outs):
        start = np.arange(o) * ss - pp
        end = np.minimum(start + kk, n + pp)
        counts.append(end - start if count_include_pad else np.minimum(end, n) - np.maximum(start, 0))
    return total / functools.reduce(np.multiply.outer, counts).astype(x.dtype)


def _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(meta, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    out = _avg_pool2d(self.astype(opmath(meta.dtype)), kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override)
    return out.astype(meta.dtype)


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(meta, grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    acc = opmath(meta.dtype)
    pool = lambda x: _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    _, vjp = jax.vjp(pool, self.astype(acc))
    return vjp(grad_output.astype(acc))[0].astype(meta.dtype)


def _adaptive_matrix(n, out):
    """(out, n) averaging matrix of adaptive pooling along one axis."""
    pos, valid = _adaptive_windows(n, out)
    m = np.zeros((out, n))
    for i in range(out):
        m[i, pos[i][valid[i]]] = 1.0 / valid[i].sum()
    return m


@lowers(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(meta, self, output_size):
    acc = opmath(meta.dtype)
    (h, w), (oh, ow) = self.shape[-2:], _tup(output_size, 2)
    mh, mw = _adaptive_matrix(h, oh).astype(acc), _adaptive_matrix(w, ow).astype(acc)
    out = jnp.einsum("...hw,oh,pw->...op", self.astype(acc), mh, mw, precision=jax.lax.Precision.HIGHEST)
    return out.astype(meta.dtype)


@lowers(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(meta, grad_output, self):
    acc = opmath(meta.dtype)
    (h, w), (oh, ow) = self.shape[-2:], grad_output.shape[-2:]
    mh, mw = _adaptive_matrix(h, oh).astype(acc), _adaptive_matrix(w, ow).astype(acc)
    out = jnp.einsum("...op,oh,pw->...hw", grad_output.astype(acc), mh, mw, precision=jax.lax.Precision.HIGHEST)
    return out.astype(meta.dtype)
