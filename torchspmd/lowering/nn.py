"""Neural-network lowerings: softmax, losses and attention (norms and activations have their own modules).

Everything computes in ``opmath`` (float32 for bf16/f16, like PyTorch CPU) and casts each
output to its ``meta`` dtype. Backward ops use the saved tensors PyTorch passes (mean/rstd,
softmax output, ...), as the aten kernels do.

Batch norm and running statistics: ``native_batch_norm`` is what ``F.batch_norm`` reaches in
training *and* eval; with ``training=True`` and running stats given, the aten kernel mutates
``running_mean``/``running_var`` although its schema has no ``(a!)``. Its lowering here is the
pure part (3 outputs). The recorder must record such a call as
``_native_batch_norm_legit_functional`` (same arguments; 5 outputs, the last two the new
running stats) and write outputs 3 and 4 into the running-stat tensors as an in-place update.
"""

import math

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import compute_in_opmath as _f, opmath
from torchspmd.lowering._common import outputs_like_meta as _outs
from torchspmd.lowering.normalization import moments
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten

# aten's Reduction enum.
_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction):
    return loss if reduction == _NONE else (jnp.mean(loss) if reduction == _MEAN else jnp.sum(loss))


def _grad_scale(grad, loss_shape, reduction):
    """The gradient of a reduced loss w.r.t. each unreduced element."""
    if reduction == _MEAN:
        return jnp.broadcast_to(grad / math.prod(loss_shape), loss_shape)
    return jnp.broadcast_to(grad, loss_shape)


# ---------------------------------------------------------------- softmax


@lowers(aten._softmax.default)
def _softmax(meta, self, dim, half_to_float):
    return jax.nn.softmax(_f(self, meta), axis=dim).astype(meta.dtype)


@lowers(aten._log_softmax.default)
def _log_softmax(meta, self, dim, half_to_float):
    return jax.nn.log_softmax(_f(self, meta), axis=dim).astype(meta.dtype)


@lowers(aten._safe_softmax.default)
def _safe_softmax(meta, self, dim, dtype=None):
    """Softmax whose fully masked (all ``-inf``) rows are 0 instead of NaN (SDPA's math path)."""
    x = _f(self, meta)
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, 0, jax.nn.softmax(x, axis=dim)).astype(meta.dtype)


@lowers(aten._softmax_backward_data.default)
def _softmax_backward_data(meta, grad_output, output, dim, input_dtype):
    g, y = _f(grad_output, meta), _f(output, meta)
    return (y * (g - jnp.sum(g * y, axis=dim, keepdims=True))).astype(meta.dtype)


@lowers(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(meta, grad_output, output, dim, input_dtype):
    g, y = _f(grad_output, meta), _f(output, meta)
    return (g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)).astype(meta.dtype)


# ---------------------------------------------------------------- losses


def _nll_parts(self, target, weight, ignore_index, acc):
    """(one-hot of the targets over the class axis, per-element weights) for nll_loss."""
    axis = 1 if self.ndim >= 2 else 0
    valid = target != ignore_index
    t = jnp.where(valid, target, 0)
    onehot = jax.nn.one_hot(t, self.shape[axis], dtype=acc, axis=axis)
    w = jnp.ones(t.shape, acc) if weight is None else weight.astype(acc)[t]
    return onehot, jnp.where(valid, w, 0), axis


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(meta, self, target, weight, reduction, ignore_index):
    acc = opmath(meta[0].dtype)
    onehot, w, axis = _nll_parts(self, target, weight, ignore_index, acc)
    loss = -jnp.sum(self.astype(acc) * onehot, axis) * w
    total = jnp.sum(w)
    if reduction == _NONE:
        return _outs(meta, (loss, jnp.zeros((), acc)))
    out = jnp.sum(loss) if reduction == _SUM else jnp.sum(loss) / total
    return _outs(meta, (out, total))


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(meta, grad_output, self, target, weight, reduction, ignore_index, total_weight):
    acc = opmath(meta.dtype)
    onehot, w, axis = _nll_parts(self, target, weight, ignore_index, acc)
    g = grad_output.astype(acc)
    g = g / total_weight.astype(acc) if reduction == _MEAN else g
    return (-onehot * jnp.expand_dims(w * g, axis)).astype(meta.dtype)


@lowers(aten.mse_loss.default)
def mse_loss(meta, self, target, reduction=_MEAN):
    return _reduce(jnp.square(_f(self, meta) - _f(target, meta)), reduction).astype(meta.dtype)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(meta, grad_output, self, target, reduction):
    d = _f(self, meta) - _f(target, meta)
    return (2 * d * _grad_scale(_f(grad_output, meta), d.shape, reduction)).astype(meta.dtype)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(meta, self, target, reduction=_MEAN, beta=1.0):
    z = jnp.abs(_f(self, meta) - _f(target, meta))
    loss = z if beta == 0 else jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)
    return _reduce(loss, reduction).astype(meta.dtype)


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(meta, grad_output, self, target, reduction, beta):
    d = _f(self, meta) - _f(target, meta)
    inner = jnp.zeros_like(d) if beta == 0 else d / beta
    slope = jnp.where(d <= -beta, -1, jnp.where(d >= beta, 1, inner))
    return (slope * _grad_scale(_f(grad_output, meta), d.shape, reduction)).astype(meta.dtype)


@lowers(aten.huber_loss.default)
def huber_loss(meta, self, target, reduction=_MEAN, delta=1.0):
    z = jnp.abs(_f(self, meta) - _f(target, meta))
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction).astype(meta.dtype)


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(meta, grad_output, self, target, reduction, delta):
    d = _f(self, meta) - _f(target, meta)
    slope = jnp.where(d <= -delta, -delta, jnp.where(d >= delta, delta, d))
    return (slope * _grad_scale(_f(grad_output, meta), d.shape, reduction)).astype(meta.dtype)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(meta, self, target, weight=None, reduction=_MEAN):
    x, t = _f(self, meta), _f(target, meta)
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    loss = loss if weight is None else loss * _f(weight, meta)
    return _reduce(loss, reduction).astype(meta.dtype)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(meta, grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = _f(self, meta), _f(target, meta)
    gi = (x - t) / jnp.maximum((1 - x) * x, 1e-12) * _grad_scale(_f(grad_output, meta), x.shape, reduction)
    return (gi if weight is None else gi * _f(weight, meta)).astype(meta.dtype)


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(meta, self, target, weight=None, pos_weight=None, reduction=_MEAN):
    x, t = _f(self, meta), _f(target, meta)
    log_weight = 1 if pos_weight is None else (_f(pos_weight, meta) - 1) * t + 1
    loss = (1 - t) * x - log_weight * jax.nn.log_sigmoid(x)
    loss = loss if weight is None else loss * _f(weight, meta)
    return _reduce(loss, reduction).astype(meta.dtype)


# ---------------------------------------------------------------- nn.MultiheadAttention fast path
#
# In eval mode with grad disabled, nn.MultiheadAttention and nn.TransformerEncoderLayer call
# these fused ops on the spmd device (PrivateUse1 is one of their supported device types, and a
# wrapper subclass without __torch_function__ passes their has_torch_function check).
# Masks arrive as bool or as float 0/-inf masks; like aten, any nonzero/True entry is masked out
# and a fully masked row gets zero weights.


def _fast_mha(x, k, v, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """(output (B, L, E), attention weights (B, H, L, S)) in x's dtype."""
    hp = jax.lax.Precision.HIGHEST
    wq, wk, wv = jnp.split(qkv_weight, 3)
    bq, bk, bv = jnp.split(qkv_bias, 3)
    heads = lambda t, w, b: (jnp.matmul(t, w.T, precision=hp) + b).reshape(
        t.shape[0], t.shape[1], num_head, -1).transpose(0, 2, 1, 3)
    q, k, v = heads(x, wq, bq), heads(k, wk, bk), heads(v, wv, bv)
    scores = jnp.einsum("bhld,bhsd->bhls", q / math.sqrt(q.shape[-1]), k, precision=hp)
    if mask is not None:
        masked = mask if mask.dtype == jnp.bool_ else mask != 0
        masked = masked[:, None, None, :] if mask_type == 1 else masked  # key padding (B, S)
        scores = jnp.where(masked, -jnp.inf, scores)
        full = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
        weights = jnp.where(full, 0, jax.nn.softmax(jnp.where(full, 0, scores), axis=-1))
    else:
        weights = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhls,bhsd->bhld", weights, v, precision=hp).transpose(0, 2, 1, 3)
    ctx = ctx.reshape(x.shape[0], -1, embed_dim)
    return jnp.matmul(ctx, proj_weight.T, precision=hp) + proj_bias, weights


@lowers(aten._native_multi_head_attention.default)
def _native_multi_head_attention(meta, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    acc = opmath(meta[0].dtype)
    args = (t.astype(acc) for t in (query, key, value))
    params = (t.astype(acc) for t in (qkv_weight, qkv_bias, proj_weight, proj_bias))
    out, weights = _fast_mha(*args, embed_dim, num_head, *params, mask, mask_type)
    weights = jnp.mean(weights, axis=1) if average_attn_weights else weights
    return _outs(meta, (out, weights))


@infers(aten._transformer_encoder_layer_fwd.default)
def _like_src(src, *args, **kwargs):
    """PyTorch 2.11 has no meta kernel for it: the layer keeps its input's shape."""
    return src.new_empty(src.shape)


@lowers(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(meta, src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                   use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                   ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    acc = opmath(meta.dtype)
    hp = jax.lax.Precision.HIGHEST
    c = lambda t: t.astype(acc)

    def norm(t, w, b):
        mean, var = moments(t, -1)
        return (t - mean) * jax.lax.rsqrt(var + eps) * c(w) + c(b)

    x = c(src)
    h = norm(x, norm_weight_1, norm_bias_1) if norm_first else x
    h = _fast_mha(h, h, h, embed_dim, num_heads, c(qkv_weight), c(qkv_bias), c(proj_weight), c(proj_bias), mask,
                  mask_type)[0] + x
    x = h if norm_first else norm(h, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = jnp.matmul(h, c(ffn_weight_1).T, precision=hp) + c(ffn_bias_1)
    h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
    h = jnp.matmul(h, c(ffn_weight_2).T, precision=hp) + c(ffn_bias_2) + x
    return (h if norm_first else norm(h, norm_weight_2, norm_bias_2)).astype(meta.dtype)


@lowers(aten.glu.default)
def glu(meta, self, dim=-1):
    a, b = jnp.split(_f(self, meta), 2, axis=dim)
    return (a * jax.nn.sigmoid(b)).astype(meta.dtype)


@lowers(aten.glu_backward.default)
def glu_backward(meta, grad_output, self, dim):
    (a, b), g = jnp.split(_f(self, meta), 2, axis=dim), _f(grad_output, meta)
    s = jax.nn.sigmoid(b)
    return jnp.concatenate([g * s, g * a * s * (1 - s)], axis=dim).astype(meta.dtype)
