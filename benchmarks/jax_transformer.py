"""``TinyTransformer`` and ``torch.optim.AdamW`` written directly in JAX: the baseline of
``benchmarks/train_step.py``.

The parameters are a flat dict keyed by the PyTorch module's ``state_dict()`` names, in
PyTorch's layouts (``nn.Linear.weight`` is ``(out, in)``; the forward contracts over its
last axis instead of transposing it). So the same weights load without reshuffling, and a
sharded run can give both sides the same partition spec per name.

    params = params_from_torch(model.state_dict())
    opt_state = adamw_init(params)
    step = make_train_step(heads=4, weight_decay=0.1)
    params, opt_state, loss = step(params, opt_state, x, y, lr)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# torch.nn.LayerNorm's default eps.
LN_EPS = 1e-5


def params_from_torch(state_dict) -> dict[str, jax.Array]:
    """The module's tensors as float32 JAX arrays under the same names, same layouts."""
    return {name: jnp.asarray(t.detach().cpu().numpy()) for name, t in state_dict.items()}


def _linear(params, name, x):
    # x @ W.T + b with W in nn.Linear's (out, in) layout: dot_general contracts x's last
    # axis with W's last, which is what F.linear lowers to as well.
    w, b = params[f"{name}.weight"], params[f"{name}.bias"]
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ()))) + b


def _layer_norm(params, name, x):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)  # biased, as torch's layer_norm
    x = (x - mean) * jax.lax.rsqrt(var + LN_EPS)
    return x * params[f"{name}.weight"] + params[f"{name}.bias"]


def _attention(q, k, v):
    """Causal softmax attention over (batch, heads, seq, head_dim), as SDPA(is_causal)."""
    t = q.shape[-2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def _block(params, prefix, x, heads):
    """One ``Block``; without ``qkv`` weights (``attention=False``) its MLP only."""
    b, t, d = x.shape
    if f"{prefix}.qkv.weight" not in params:
        return x + _mlp(params, prefix, x)
    qkv = _linear(params, f"{prefix}.qkv", _layer_norm(params, f"{prefix}.norm1", x))
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
               for z in jnp.split(qkv, 3, axis=-1))
    attn = _attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + _linear(params, f"{prefix}.proj", attn)
    return x + _mlp(params, prefix, x)


def _mlp(params, prefix, x):
    h = _linear(params, f"{prefix}.up", _layer_norm(params, f"{prefix}.norm2", x))
    # F.gelu's default is the exact (erf) form, not the tanh approximation.
    return _linear(params, f"{prefix}.down", jax.nn.gelu(h, approximate=False))


def layer_count(params) -> int:
    return len({name.split(".")[1] for name in params if name.startswith("blocks.")})


def forward(params, idx, heads: int):
    """Logits (batch, seq, vocab) of ``TinyTransformer`` for token ids ``idx``."""
    x = params["tok.weight"][idx] + params["pos.weight"][: idx.shape[1]]
    for i in range(layer_count(params)):
        x = _block(params, f"blocks.{i}", x, heads)
    return _linear(params, "head", _layer_norm(params, "norm", x))


def lm_loss(params, x, y, heads: int):
    """Mean next-token cross entropy, as ``torchspmd.testing.models.lm_loss``."""
    logits = forward(params, x, heads)
    logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
    return -jnp.take_along_axis(logp, y.reshape(-1, 1), axis=-1).mean()


def adamw_init(params):
    """AdamW state: step count and both moments, zeros as torch makes them lazily."""
    # Two separate trees of zeros: donated buffers must not alias each other.
    def zeros():
        return {k: jnp.zeros_like(p) for k, p in params.items()}
    return {"step": jnp.zeros((), jnp.float32), "exp_avg": zeros(), "exp_avg_sq": zeros()}


def adamw_update(params, grads, state, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """One ``torch.optim.AdamW`` step (defaults, amsgrad off), decoupled weight decay first.

    Same order of operations as torch's single-tensor AdamW: decay the parameter, update
    the moments, then ``p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``.
    """
    b1, b2 = betas
    step = state["step"] + 1
    bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k]
        p = p * (1 - lr * weight_decay)
        m = state["exp_avg"][k] * b1 + g * (1 - b1)
        v = state["exp_avg_sq"][k] * b2 + g * g * (1 - b2)
        denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps
        new_p[k], new_m[k], new_v[k] = p - (lr / bc1) * m / denom, m, v
    return new_p, {"step": step, "exp_avg": new_m, "exp_avg_sq": new_v}


def make_train_step(heads: int, weight_decay: float, out_shardings=None):
    """The whole step (forward, backward, AdamW) as one jitted function.

    ``lr`` is an argument, so the decaying schedule does not recompile; params and
    optimizer state are donated, as an in-place update on an accelerator would be.
    ``out_shardings`` (optional, ``(params, opt_state, loss)`` shardings) keeps a sharded
    state in the layout it came in with: otherwise XLA may hand it back in an equivalent
    but differently spelled sharding (``P('data', None)`` as ``P('data')``), and the
    second call compiles again. Everything inside the step still propagates freely.

    float32 matmuls run at full precision, as PyTorch's and so torchspmd's do by default
    (``torch.get_float32_matmul_precision() == "highest"``): on a GPU, JAX's default
    would be TF32, a different computation from the one compared against.
    """

    def train_step(params, opt_state, x, y, lr):
        with jax.default_matmul_precision("highest"):
            loss, grads = jax.value_and_grad(lm_loss)(params, x, y, heads)
        params, opt_state = adamw_update(params, grads, opt_state, lr, weight_decay)
        return params, opt_state, loss

    if out_shardings is None:
        return jax.jit(train_step, donate_argnums=(0, 1))
    return jax.jit(train_step, donate_argnums=(0, 1), out_shardings=out_shardings)


def as_lr(lr: float) -> jax.Array:
    # torchspmd turns JAX's x64 mode on, where a Python float becomes a float64 argument;
    # an explicit float32 scalar keeps the update in the parameters' precision.
    return jnp.asarray(np.float32(lr))
