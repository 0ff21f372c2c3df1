"""Fused LSTM and GRU cells: what ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell`` and ``nn.GRUCell``
run on any device but the CPU (PyTorch picks the fused cells for CUDA, XPU and
PrivateUse1), forward and backward.

A fused cell takes the two matmuls' results (``input_gates = x @ w_ih.T``,
``hidden_gates = h @ w_hh.T``) and the biases, and returns the new state with a
``workspace`` that only its own backward reads; its layout is this module's choice:

- LSTM: the gates after their activations, ``[i, f, g, o]`` (``4 H`` wide), PyTorch's
  gate order;
- GRU: ``[r, z, n, hx, hidden n]`` (``5 H`` wide): the reset, update and new gates, the
  old state and the hidden part of the new gate before the reset gate scales it.

Example (what PyTorch records for one LSTM step on the device)::

    hy, cy, workspace = aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cx, b_ih, b_hh)
"""

import jax
import jax.numpy as jnp
from torch import ops

from torchspmd.lowering._common import compute_in_opmath as _f
from torchspmd.lowering._common import outputs_like_meta as _outs
from torchspmd.lowering.registry import infers, lowers

aten = ops.aten


def _biased(meta, gates, bias):
    """A matmul's gates plus its bias (if any), in ``meta``'s compute type."""
    gates = _f(gates, meta)
    return gates if bias is None else gates + _f(bias, meta)


def _bias_grad(grad_gates, has_bias: bool):
    return jnp.sum(grad_gates, 0) if has_bias else None


@lowers(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(meta, input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _biased(meta[0], input_gates, input_bias) + _biased(meta[0], hidden_gates, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, 1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _f(cx, meta[0]) + i * g
    return _outs(meta, (o * jnp.tanh(cy), cy, jnp.concatenate([i, f, g, o], 1)))


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(meta, grad_hy, grad_cy, cx, cy, workspace, has_bias):
    like = meta[0]
    i, f, g, o = jnp.split(_f(workspace, like), 4, 1)
    cx, cy = _f(cx, like), _f(cy, like)
    tanh_cy = jnp.tanh(cy)
    zeros = jnp.zeros_like(cy)
    grad_hy = zeros if grad_hy is None else _f(grad_hy, like)
    grad_c = (zeros if grad_cy is None else _f(grad_cy, like)) + grad_hy * o * (1 - tanh_cy ** 2)
    grad_gates = jnp.concatenate([grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f),
                                  grad_c * i * (1 - g ** 2), grad_hy * tanh_cy * o * (1 - o)], 1)
    return _outs(meta, (grad_gates, grad_c * f, _bias_grad(grad_gates, has_bias)))


@lowers(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(meta, input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    like = meta[0]
    i_r, i_z, i_n = jnp.split(_biased(like, input_gates, input_bias), 3, 1)
    h_r, h_z, h_n = jnp.split(_biased(like, hidden_gates, hidden_bias), 3, 1)
    r, z = jax.nn.sigmoid(i_r + h_r), jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    hx = _f(hx, like)
    return _outs(meta, (n + z * (hx - n), jnp.concatenate([r, z, n, hx, h_n], 1)))


@lowers(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(meta, grad_hy, workspace, has_bias):
    like = meta[0]
    r, z, n, hx, h_n = jnp.split(_f(workspace, like), 5, 1)
    grad_hy = _f(grad_hy, like)
    grad_n = grad_hy * (1 - z) * (1 - n ** 2)
    grad_r = grad_n * h_n * r * (1 - r)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], 1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], 1)
    return _outs(meta, (grad_input, grad_hidden, grad_hy * z, _bias_grad(grad_input, has_bias),
                        _bias_grad(grad_hidden, has_bias)))


# Shapes for the recorder: PyTorch has no meta kernels for the GRU cells, and its LSTM
# cell's fails without biases (it compares each bias's device, None included).
@infers(aten._thnn_fused_lstm_cell.default)
def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    return cx.new_empty(cx.shape), cx.new_empty(cx.shape), input_gates.new_empty(input_gates.shape)


@infers(aten._thnn_fused_gru_cell.default)
def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


@infers(aten._thnn_fused_gru_cell_backward.default)
def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    batch, hidden = grad_hy.shape
    gates = grad_hy.new_empty((batch, 3 * hidden))
    bias = grad_hy.new_empty((3 * hidden,)) if has_bias else None
    return (gates, gates.clone(), grad_hy.new_empty(grad_hy.shape), bias,
            None if bias is None else bias.clone())
