"""``TinyMoE`` (``moe_model.py``) and AdamW written directly in JAX: the baseline of
``benchmarks/moe.py``.

Parameters are a flat dict keyed by the PyTorch module's ``state_dict()`` names, in its
layouts, as in ``jax_transformer.py`` (whose attention, LayerNorm and AdamW this reuses).
The experts are what one writes in JAX by hand: sort the (token, expert) pairs by expert
and ``lax.ragged_dot`` over the group sizes.

    params = jt.params_from_torch(model.state_dict())
    step = make_train_step(heads=4, top_k=2, weight_decay=0.1)
    params, opt_state, loss = step(params, jt.adamw_init(params), x, y, lr)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_transformer as jt  # a sibling: moe.py puts benchmarks/ on the path


def experts(params, prefix, x, top_k_index, top_k_weights):
    """The routed experts of ``moe_model.Experts``: x (tokens, dim) -> (tokens, dim)."""
    gate_up, down = params[f"{prefix}.gate_up_proj"], params[f"{prefix}.down_proj"]
    n, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    perm = jnp.argsort(flat)
    sizes = (flat[:, None] == jnp.arange(gate_up.shape[0])[None]).sum(0).astype(jnp.int32)
    hp = jax.lax.Precision.HIGHEST  # float32 as PyTorch multiplies it
    # (rows, dim) x (experts, 2*hidden, dim) contracting dim with dim: weights stay (out, in).
    numbers = jax.lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), (0,), (0,))
    h = jax.lax.ragged_dot_general(x[perm // k], gate_up, sizes, numbers, precision=hp)
    gate, up = jnp.split(h, 2, axis=-1)
    h = jax.lax.ragged_dot_general(jax.nn.silu(gate) * up, down, sizes, numbers, precision=hp)
    h = h * top_k_weights.reshape(-1)[perm, None]
    inv_perm = jnp.zeros_like(perm).at[perm].set(jnp.arange(perm.shape[0]))
    return h[inv_perm].reshape(n, k, -1).sum(1)


def moe(params, prefix, x, top_k: int):
    """``moe_model.MoEFeedForward``: softmax router, top-k, renormalized weights."""
    b, t, d = x.shape
    x = x.reshape(-1, d)
    logits = jax.lax.dot_general(x, params[f"{prefix}.gate.weight"], (((1,), (1,)), ((), ())))
    weights, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    weights = weights / weights.sum(-1, keepdims=True)
    return experts(params, f"{prefix}.experts", x, ids, weights).reshape(b, t, d)


def _block(params, prefix, x, heads, top_k):
    b, t, d = x.shape
    qkv = jt._linear(params, f"{prefix}.qkv", jt._layer_norm(params, f"{prefix}.norm1", x))
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
               for z in jnp.split(qkv, 3, axis=-1))
    attn = jt._attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + jt._linear(params, f"{prefix}.proj", attn)
    return x + moe(params, f"{prefix}.moe", jt._layer_norm(params, f"{prefix}.norm2", x), top_k)


def lm_loss(params, x, y, heads: int, top_k: int):
    """Mean next-token cross entropy of ``TinyMoE``."""
    h = params["tok.weight"][x] + params["pos.weight"][: x.shape[1]]
    for i in range(jt.layer_count(params)):
        h = _block(params, f"blocks.{i}", h, heads, top_k)
    logits = jt._linear(params, "head", jt._layer_norm(params, "norm", h))
    logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
    return -jnp.take_along_axis(logp, y.reshape(-1, 1), axis=-1).mean()


def make_train_step(heads: int, top_k: int, weight_decay: float, out_shardings=None):
    """Forward, backward and AdamW as one jitted function, parameters and state donated."""

    def train_step(params, opt_state, x, y, lr):
        loss, grads = jax.value_and_grad(lm_loss)(params, x, y, heads, top_k)
        params, opt_state = jt.adamw_update(params, grads, opt_state, lr, weight_decay)
        return params, opt_state, loss

    return jax.jit(train_step, donate_argnums=(0, 1), out_shardings=out_shardings)
