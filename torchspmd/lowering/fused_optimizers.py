"""``torch.optim``'s fused kernels (``Adam``, ``AdamW``, ``SGD``, ``Adagrad`` with
``fused=True``) -> JAX: one op for a whole parameter group.

What they add over the ``foreach`` path is what makes them *sync-free*: ``GradScaler``
hands a fused optimizer its scale and its ``found_inf`` flag (the optimizer sets
``_step_supports_amp_scaling``), and the kernel unscales the gradients itself and skips
the update when ``found_inf`` is 1, with no host read: a scaled step compiles whole into
one ``torchspmd.compile`` program, as PyTorch/XLA's ``syncfree`` optimizers do there.

Semantics are PyTorch's CPU kernels' (``aten/src/ATen/native/cpu/Fused*Kernel.cpp``):
the bias corrections and the decayed learning rate in float64 from the step count, the
rest in the parameter's compute type (float32 for half types). With ``grad_scale`` each
gradient is written back divided by it; with ``found_inf`` equal to 1 nothing changes
(the kernel returns early; here every output selects its input). Step counts are not
written here: the optimizer's Python adds 1 before and subtracts ``found_inf`` after.

A ``float lr`` is a graph input, not a constant of the program (``lazy/schema.py``): a
schedule changes it every step without a recompile.

Outputs are one flat list, the functional op's lists in order (``self_out``,
``grads_out``, then the state lists), which is how the recorder assigns them back to
the in-place op's arguments.

Example: ``torch.optim.AdamW(model.parameters(), fused=True)`` on spmd tensors records
one ``aten._fused_adamw`` node per step.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from torchspmd.lowering.dtypes import opmath
from torchspmd.lowering.registry import infers, lowers

aten = torch.ops.aten


def _ops(name: str, *overloads: str) -> list:
    """The overloads of ``aten.<name>`` this PyTorch has (``default`` and ``tensor_lr``
    unless named): the set has grown from release to release."""
    packet = getattr(aten, name, None)
    have = packet.overloads() if packet is not None else ()
    return [getattr(packet, o) for o in overloads or ("default", "tensor_lr") if o in have]


def _f64(x):
    return jnp.asarray(x, np.float64)


def _skipper(found_inf):
    """``update(old, new)``: ``new``, or ``old`` where ``found_inf`` is 1 (the kernel's
    early return)."""
    if found_inf is None:
        return lambda old, new: new
    skip = found_inf.reshape(()) == 1
    return lambda old, new: jnp.where(skip, old, new)


def _unscaled(grad, compute, grad_scale):
    """The gradient in the compute type, divided by ``grad_scale``; and the gradient
    the kernel leaves behind (written back only when it was scaled)."""
    g = grad.astype(compute)
    if grad_scale is None:
        return g, grad
    g = g / grad_scale.reshape(()).astype(compute)
    return g, g.astype(grad.dtype)


def _prepared(p, grad, grad_scale, maximize: bool, weight_decay: float):
    """A kernel's first lines for one parameter: its compute type, the gradient there
    (unscaled, negated to maximize, plus the L2 term ``weight_decay * param``), the
    gradient left behind (``_unscaled``) and the parameter in the compute type."""
    c = opmath(p.dtype)
    g, grad_out = _unscaled(grad, c, grad_scale)
    if maximize:
        g = -g
    param = p.astype(c)
    if weight_decay != 0:
        g = g + param * c.type(weight_decay)
    return c, g, grad_out, param


def _adam(meta, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
          beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
          found_inf=None, decoupled=False):
    keep = _skipper(found_inf)
    beta1, beta2, weight_decay, eps = map(float, (beta1, beta2, weight_decay, eps))
    out_p, out_g, out_m, out_v, out_max = [], [], [], [], []
    for i, (p, grad, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs,
                                                  state_steps)):
        c, g, grad_out, param = _prepared(p, grad, grad_scale, maximize,
                                          0.0 if decoupled else weight_decay)
        if decoupled and weight_decay != 0:  # AdamW: the parameter decays, not the gradient
            param = param * (1 - _f64(lr) * weight_decay).astype(c)
        s = _f64(step).reshape(())
        step_size = (_f64(lr) / (1 - beta1 ** s)).astype(c)
        bias2_sqrt = jnp.sqrt(1 - beta2 ** s).astype(c)
        m_new = m.astype(c) * c.type(beta1) + g * c.type(1 - beta1)
        v_new = v.astype(c) * c.type(beta2) + g * g * c.type(1 - beta2)
        if amsgrad:
            top = jnp.maximum(max_exp_avg_sqs[i].astype(c), v_new)
            out_max.append(keep(max_exp_avg_sqs[i], top.astype(max_exp_avg_sqs[i].dtype)))
            denom = jnp.sqrt(top) / bias2_sqrt + c.type(eps)
        else:
            denom = jnp.sqrt(v_new) / bias2_sqrt + c.type(eps)
        param = param - step_size * m_new / denom
        out_p.append(keep(p, param.astype(p.dtype)))
        out_g.append(keep(grad, grad_out))
        out_m.append(keep(m, m_new.astype(m.dtype)))
        out_v.append(keep(v, v_new.astype(v.dtype)))
    return [*out_p, *out_g, *out_m, *out_v, *out_max]


@lowers(*_ops("_fused_adam"))
def fused_adam(meta, *args, **kwargs):
    return _adam(meta, *args, **kwargs)


@lowers(*_ops("_fused_adamw"))
def fused_adamw(meta, *args, **kwargs):
    return _adam(meta, *args, **kwargs, decoupled=True)


@lowers(*_ops("_fused_sgd"))
def fused_sgd(meta, params, grads, momentum_buffer_list, *, weight_decay, momentum, lr,
              dampening, nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    keep = _skipper(found_inf)
    weight_decay, momentum, dampening = map(float, (weight_decay, momentum, dampening))
    out_p, out_g, out_buf = [], [], []
    for i, (p, grad) in enumerate(zip(params, grads)):
        c, g, grad_out, param = _prepared(p, grad, grad_scale, maximize, weight_decay)
        if momentum != 0:
            buf = momentum_buffer_list[i]
            if is_first_step:  # the buffers are new (``empty_like``): the gradient
                b = g
            else:
                b = buf.astype(c) * c.type(momentum) + g * c.type(1 - dampening)
            out_buf.append(keep(buf, b.astype(buf.dtype)))
            g = g + b * c.type(momentum) if nesterov else b
        param = param - g * _f64(lr).astype(c)
        out_p.append(keep(p, param.astype(p.dtype)))
        out_g.append(keep(grad, grad_out))
    return [*out_p, *out_g, *out_buf]


def _adagrad(meta, params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay,
             eps, maximize, grad_scale=None, found_inf=None):
    keep = _skipper(found_inf)
    lr_decay, weight_decay, eps = map(float, (lr_decay, weight_decay, eps))
    out_p, out_g, out_sum = [], [], []
    for p, grad, total, step in zip(params, grads, state_sums, state_steps):
        c, g, grad_out, param = _prepared(p, grad, grad_scale, maximize, weight_decay)
        clr = (_f64(lr) / (1 + (_f64(step).reshape(()) - 1) * lr_decay)).astype(c)
        total_new = total.astype(c) + g * g
        param = param - clr * g / (jnp.sqrt(total_new) + c.type(eps))
        out_p.append(keep(p, param.astype(p.dtype)))
        out_g.append(keep(grad, grad_out))
        out_sum.append(keep(total, total_new.astype(total.dtype)))
    return [*out_p, *out_g, *out_sum]


@lowers(*_ops("_fused_adagrad", "default"))
def fused_adagrad(meta, params, grads, state_sums, state_steps, **kwargs):
    # This overload also returns the step counts (unchanged: the Python side counts).
    return [*_adagrad(meta, params, grads, state_sums, state_steps, **kwargs), *state_steps]


@lowers(*_ops("_fused_adagrad", "tensor_lr"))
def fused_adagrad_tensor_lr(meta, *args, **kwargs):
    return _adagrad(meta, *args, **kwargs)


# --- shapes: PyTorch's meta kernels give nested lists, or none at all ---------------------

def _same_lengths(name: str, lists: dict) -> None:
    """PyTorch's own check of a fused kernel's lists (empty state lists are allowed where
    the option is off: amsgrad, momentum)."""
    n = len(lists["self"])
    for key, value in lists.items():
        if value and len(value) != n:
            raise RuntimeError(f"torch.{name}: {key} has {len(value)} tensors, expected {n} "
                               "(one per parameter)")


def _copies(*lists) -> list:
    return [torch.empty_like(t) for group in lists for t in group]


@infers(*_ops("_fused_adam"), *_ops("_fused_adamw"))
def _adam_shapes(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kwargs):
    _same_lengths("_fused_adam", dict(self=self, grads=grads, exp_avgs=exp_avgs,
                                      exp_avg_sqs=exp_avg_sqs, state_steps=state_steps))
    return _copies(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)


@infers(*_ops("_fused_sgd"))
def _sgd_shapes(self, grads, momentum_buffer_list, **kwargs):
    _same_lengths("_fused_sgd", dict(self=self, grads=grads,
                                     momentum_buffer_list=momentum_buffer_list))
    return _copies(self, grads, momentum_buffer_list)


# PyTorch has meta kernels for some of these (not SGD's, Adagrad's, or any tensor_lr one).
@infers(*(op for name in ("adam", "adamw", "sgd", "adagrad") for op in _ops(f"_fused_{name}_")))
def _in_place_shapes(self, grads, *state, **kwargs):
    _same_lengths("fused optimizer step", dict(self=self, grads=grads))
    return None


@infers(*_ops("_fused_adagrad", "default"))
def _adagrad_shapes(self, grads, state_sums, state_steps, **kwargs):
    _same_lengths("_fused_adagrad", dict(self=self, grads=grads, state_sums=state_sums,
                                         state_steps=state_steps))
    return _copies(self, grads, state_sums, state_steps)


@infers(*_ops("_fused_adagrad", "tensor_lr"))
def _adagrad_tensor_lr_shapes(self, grads, state_sums, state_steps, **kwargs):
    _same_lengths("_fused_adagrad", dict(self=self, grads=grads, state_sums=state_sums,
                                         state_steps=state_steps))
    return _copies(self, grads, state_sums)
