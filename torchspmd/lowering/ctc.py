"""``_ctc_loss`` and ``_ctc_loss_backward`` (``F.ctc_loss``, ``nn.CTCLoss``) -> JAX.

The forward is the CTC alpha recursion in log space, one ``lax.scan`` step per time
step over the extended target (blank, l1, blank, l2, ..., blank), for every sequence of
the batch at once: each sequence's input and target lengths mask it (static shapes, no
host read), so the lengths may be device tensors. Its outputs are PyTorch's: the
negative log likelihood per sequence and ``log_alpha`` (batch, time, 2 * S + 1), where S
is the longest target the shapes allow (PyTorch sizes it by the longest target length's
value; only the backward reads it, and this backward recomputes instead).

The backward is PyTorch's formula, not the plain derivative: PyTorch returns
``exp(log_probs) * grad - posterior * grad`` (the gradient a log-softmax before the loss
turns into the logits' gradient), zero past each input's length, and zero for an
infinite loss with ``zero_infinity``. The posterior term is the ``jax.vjp`` of the
forward.

Example: ``F.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths)``
on spmd tensors trains as on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torchspmd.lowering.dtypes import opmath
from torchspmd.lowering.registry import infers, lowers

aten = torch.ops.aten


def _padded_targets(targets, target_lengths):
    """Targets as (batch, S >= 1): 2-D targets as they are; 1-D (concatenated) ones
    gathered per sequence from its offset (entries past a sequence's length are never
    read: the extended target masks them)."""
    batch = target_lengths.shape[0]
    if targets.ndim == 2:
        return targets if targets.shape[1] else jnp.zeros((batch, 1), targets.dtype)
    total = targets.shape[0]
    if total == 0:
        return jnp.zeros((batch, 1), targets.dtype)
    offsets = jnp.cumsum(target_lengths) - target_lengths
    return targets[jnp.clip(offsets[:, None] + jnp.arange(total)[None, :], 0, total - 1)]


def _lse(*terms):
    """log(sum(exp(terms))) that is -inf, with a zero gradient, where all are -inf."""
    top = jax.lax.stop_gradient(jnp.maximum(*terms[:2]) if len(terms) == 2
                                else jnp.maximum(jnp.maximum(terms[0], terms[1]), terms[2]))
    top = jnp.where(jnp.isfinite(top), top, 0)
    total = sum(jnp.exp(t - top) for t in terms)
    positive = total > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, total, 1)) + top, -jnp.inf)


def _forward(log_probs, targets, input_lengths, target_lengths, blank: int):
    """(negative log likelihood (N,), log_alpha (N, T, 2S+1)) in log_probs' dtype; S is
    the targets' longest possible length (their second dim, or all of a 1-D one)."""
    T, N, _ = log_probs.shape
    input_lengths = input_lengths.astype(jnp.int32).reshape(N)
    target_lengths = target_lengths.astype(jnp.int32).reshape(N)
    labels = _padded_targets(targets, target_lengths).astype(jnp.int32)
    S = labels.shape[1]
    width = 2 * (targets.shape[1] if targets.ndim == 2 else targets.shape[0]) + 1
    s = jnp.arange(width)
    # The extended target: blank at even positions, label (s - 1) / 2 at odd ones.
    ext = jnp.where(s % 2 == 1, labels[:, jnp.clip((s - 1) // 2, 0, S - 1)], blank)
    valid = s[None, :] < 2 * target_lengths[:, None] + 1
    # A skip over a blank from s - 2 is allowed between two different labels.
    previous = jnp.concatenate([jnp.full((N, 2), -1, ext.dtype), ext[:, :-2]], axis=1)
    skip = (s[None, :] % 2 == 1) & (s[None, :] >= 2) & (ext != previous)
    neg_inf = jnp.array(-jnp.inf, log_probs.dtype)

    def emit(t):
        return jnp.take_along_axis(log_probs[t], ext, axis=1)

    first = jnp.where((s[None, :] < 2) & valid, emit(0), neg_inf)

    def step(alpha, t):
        stay = alpha
        move = jnp.concatenate([jnp.full((N, 1), neg_inf), alpha[:, :-1]], axis=1)
        jump = jnp.where(skip, jnp.concatenate([jnp.full((N, 2), neg_inf), alpha[:, :-2]],
                                               axis=1), neg_inf)
        new = jnp.where(valid, _lse(stay, move, jump) + emit(t), neg_inf)
        new = jnp.where((t < input_lengths)[:, None], new, alpha)  # past its input: frozen
        return new, new

    last, rest = jax.lax.scan(step, first, jnp.arange(1, T))
    log_alpha = jnp.concatenate([first[None], rest], axis=0).transpose(1, 0, 2)
    end = 2 * target_lengths
    at_end = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    before_end = jnp.take_along_axis(last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    likelihood = jnp.where(target_lengths > 0, _lse(at_end, before_end), at_end)
    # An empty input: certain if the target is empty too, impossible otherwise.
    likelihood = jnp.where(input_lengths == 0,
                           jnp.where(target_lengths == 0, 0.0, -jnp.inf).astype(last.dtype),
                           likelihood)
    return -likelihood, log_alpha


def _lengths(value, batch: int):
    return jnp.asarray(np.asarray(value, np.int64) if isinstance(value, (list, tuple))
                       else value).reshape(batch)


@lowers(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def ctc_loss(meta, log_probs, targets, input_lengths, target_lengths, blank=0,
             zero_infinity=False):
    compute = opmath(meta[0].dtype)
    batch = log_probs.shape[1]
    nll, log_alpha = _forward(log_probs.astype(compute), targets,
                              _lengths(input_lengths, batch), _lengths(target_lengths, batch),
                              blank)
    return nll.astype(meta[0].dtype), log_alpha.astype(meta[1].dtype)


@lowers(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(meta, grad, log_probs, targets, input_lengths, target_lengths,
                      neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    compute = opmath(meta.dtype)
    T, batch, _ = log_probs.shape
    inputs, lengths = _lengths(input_lengths, batch), _lengths(target_lengths, batch)
    lp = log_probs.astype(compute)
    grad = jnp.broadcast_to(grad.astype(compute), (batch,))
    nll, vjp = jax.vjp(lambda x: _forward(x, targets, inputs, lengths, blank)[0], lp)
    (posterior,) = vjp(grad)  # = -posterior * grad, the derivative of the loss
    out = jnp.exp(lp) * grad[None, :, None] + posterior
    alive = (jnp.arange(T)[:, None] < inputs[None, :])[:, :, None]
    if zero_infinity:
        alive = alive & jnp.isfinite(nll)[None, :, None]
    return jnp.where(alive, out, 0).astype(meta.dtype)


@infers(aten._ctc_loss.Tensor, aten._ctc_loss.default)
def _ctc_shapes(log_probs, targets, input_lengths, target_lengths, blank=0,
                zero_infinity=False):
    batch = log_probs.shape[1] if log_probs.dim() == 3 else 1
    longest = targets.shape[1] if targets.dim() == 2 else targets.shape[0]
    return (log_probs.new_empty((batch,)),
            log_probs.new_empty((batch, log_probs.shape[0], 2 * longest + 1)))


@infers(aten._ctc_loss_backward.Tensor, aten._ctc_loss_backward.default)
def _ctc_backward_shapes(grad, log_probs, *rest, **kwargs):
    return log_probs.new_empty(log_probs.shape)
