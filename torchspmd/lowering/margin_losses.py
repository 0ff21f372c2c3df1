"""Backward ops of the multi-class margin losses (``multi_margin_loss``,
``multilabel_margin_loss``), as ``jax.vjp`` of the losses written in JAX.

``multi_margin_loss`` reaches the device through PyTorch's decomposition;
``multilabel_margin_loss_forward`` is lowered here (the decomposition counts target entries
after a ``-1``). The formulas:

- multi-margin: ``sum_{i != y} w[y] * max(0, margin - x[y] + x[i]) ** p / C`` per sample;
- multilabel-margin: ``sum_{j in targets} sum_{i not a target} max(0, 1 - (x[j] - x[i])) / C``
  per sample, the targets being ``target``'s entries before its first ``-1``.
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import opmath
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten

_NONE, _MEAN = 0, 1


@infers(aten.multi_margin_loss_backward.default, aten.multilabel_margin_loss_backward.default)
def _like_self(grad_output, self, *args, **kwargs):
    """PyTorch has no meta kernel for these: the gradient has the input's shape."""
    return self.new_empty(self.shape)


def _reduce(per_sample, reduction: int):
    if reduction == _NONE:
        return per_sample
    return jnp.mean(per_sample) if reduction == _MEAN else jnp.sum(per_sample)


def _grad_of(loss, x, grad_output, meta):
    """``d loss(x) / dx`` applied to ``grad_output``, shaped and typed as ``meta``."""
    acc = opmath(meta.dtype)
    out, vjp = jax.vjp(loss, x.reshape(-1, x.shape[-1] if x.ndim else 1).astype(acc))
    return vjp(grad_output.astype(out.dtype).reshape(out.shape))[0].reshape(meta.shape).astype(meta.dtype)


@lowers(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(meta, grad_output, self, target, p, margin, weight=None,
                               reduction=_MEAN):
    target = target.reshape(-1)

    def loss(x):
        classes = x.shape[1]
        picked = jnp.take_along_axis(x, target[:, None], axis=1)
        terms = jnp.maximum(jnp.asarray(margin, x.dtype) - picked + x, 0)
        terms = jnp.where(p == 2, terms * terms, terms)  # p (1 or 2) may be a traced Scalar
        if weight is not None:
            terms = terms * weight.astype(x.dtype)[target][:, None]
        terms = jnp.where(jnp.arange(classes)[None, :] == target[:, None], 0, terms)
        return _reduce(jnp.sum(terms, axis=1) / classes, reduction)

    return _grad_of(loss, self, grad_output, meta)


def _multilabel_parts(target, classes: int):
    """(targets as (N, K) class indices, which of them are listed: before the first -1)."""
    target = target.reshape(-1, classes)
    return target, jnp.cumprod(target >= 0, axis=1).astype(bool)


def _multilabel_loss(target, listed, is_target, reduction):
    classes = target.shape[1]

    def loss(x):
        picked = jnp.take_along_axis(x, jnp.clip(target, 0, classes - 1), axis=1)  # (N, K)
        margins = jnp.maximum(1 - (picked[:, :, None] - x[:, None, :]), 0)  # (N, K, C)
        keep = listed[:, :, None] & ~is_target[:, None, :]
        return _reduce(jnp.sum(jnp.where(keep, margins, 0), axis=(1, 2)) / classes, reduction)

    return loss


@lowers(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(meta, self, target, reduction):
    """Lowered (not decomposed): PyTorch's decomposition counts entries after a -1."""
    out_meta, is_target_meta = meta
    classes = self.shape[-1] if self.ndim else 1
    target, listed = _multilabel_parts(target, classes)
    rows = jnp.arange(target.shape[0])[:, None]
    is_target = jnp.zeros(target.shape, bool).at[rows, jnp.clip(target, 0, classes - 1)].max(listed)
    x = self.reshape(-1, classes).astype(opmath(out_meta.dtype))
    out = _multilabel_loss(target, listed, is_target, reduction)(x)
    return (out.reshape(out_meta.shape).astype(out_meta.dtype),
            is_target.reshape(is_target_meta.shape).astype(is_target_meta.dtype))


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(meta, grad_output, self, target, reduction, is_target):
    classes = self.shape[-1] if self.ndim else 1
    target, listed = _multilabel_parts(target, classes)
    is_target = is_target.reshape(-1, classes).astype(bool)
    return _grad_of(_multilabel_loss(target, listed, is_target, reduction), self, grad_output, meta)
