"""Hugging Face's ``LlamaForCausalLM`` written directly in JAX, with a static KV cache: the
baseline of ``benchmarks/generate.py``.

Parameters are a flat dict keyed by the PyTorch ``state_dict()`` names, in PyTorch's
layouts (a Linear's weight is ``(out, in)``), so the same weights load unchanged and a
sharded run gives both sides the same partition per name. The math follows
``transformers.models.llama.modeling_llama``: RMSNorm in float32, rotary embeddings with
``rotate_half``, grouped-query attention, SiLU-gated MLP.

    params = params_from_torch(model.state_dict())
    decoder = Decoder(config, max_len=264)
    cache, token = decoder.prefill(params, decoder.empty_cache(batch), prompt)
    cache, token = decoder.step(params, cache, token, position)      # one jitted call
    cache, made = decoder.greedy_loop(params, cache, token, position, count)  # or all at once
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


def params_from_torch(state_dict) -> dict[str, jax.Array]:
    """The module's tensors as JAX arrays under the same names, same layouts."""
    return {name: jnp.asarray(t.detach().cpu().numpy()) for name, t in state_dict.items()}


def _linear(params, name, x):
    # x @ W.T with W in (out, in): contract x's last axis with W's last, as F.linear
    w = params[f"{name}.weight"]
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))


def _rms_norm(params, name, x, eps):
    var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return params[f"{name}.weight"] * (x * jax.lax.rsqrt(var + eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@dataclass(frozen=True)
class Decoder:
    """Jitted prefill and decode step of one Llama config, cache of ``max_len`` positions."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    max_len: int

    @classmethod
    def of(cls, config, max_len: int) -> "Decoder":
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return cls(config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, config.hidden_size // config.num_attention_heads,
                   config.rms_norm_eps, float(theta), max_len)

    def empty_cache(self, batch: int, dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
        shape = (self.layers, batch, self.kv_heads, self.max_len, self.head_dim)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def forward(self, params, cache, ids, start):
        """Logits of the last position of ``ids`` (batch, q) at positions ``start..``, and
        the cache with their keys and values written in."""
        keys, values = cache
        b, q = ids.shape
        start = jnp.asarray(start)
        at = (jnp.zeros((), start.dtype),) * 2 + (start, jnp.zeros((), start.dtype))
        pos = start + jnp.arange(q)
        inv_freq = 1.0 / (self.theta ** (jnp.arange(0, self.head_dim, 2, dtype=jnp.float32)
                                         / self.head_dim))
        freqs = pos[:, None].astype(jnp.float32) * inv_freq
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        cos, sin = jnp.cos(emb)[None, None], jnp.sin(emb)[None, None]
        visible = jnp.arange(self.max_len)[None, :] <= pos[:, None]  # (q, max_len)
        x = params["model.embed_tokens.weight"][ids]
        rep = self.heads // self.kv_heads
        for i in range(self.layers):
            p = f"model.layers.{i}"
            h = _rms_norm(params, f"{p}.input_layernorm", x, self.eps)
            qh = _linear(params, f"{p}.self_attn.q_proj", h).reshape(b, q, self.heads, -1)
            kh = _linear(params, f"{p}.self_attn.k_proj", h).reshape(b, q, self.kv_heads, -1)
            vh = _linear(params, f"{p}.self_attn.v_proj", h).reshape(b, q, self.kv_heads, -1)
            qh, kh, vh = (z.transpose(0, 2, 1, 3) for z in (qh, kh, vh))
            qh = qh * cos + _rotate_half(qh) * sin
            kh = kh * cos + _rotate_half(kh) * sin
            keys = keys.at[i].set(jax.lax.dynamic_update_slice(keys[i], kh, at))
            values = values.at[i].set(jax.lax.dynamic_update_slice(values[i], vh, at))
            k = jnp.repeat(keys[i], rep, axis=1)
            v = jnp.repeat(values[i], rep, axis=1)
            scores = jnp.einsum("bhqd,bhkd->bhqk", qh, k) * self.head_dim ** -0.5
            scores = jnp.where(visible[None, None], scores, -jnp.inf)
            attn = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
            attn = attn.transpose(0, 2, 1, 3).reshape(b, q, -1)
            x = x + _linear(params, f"{p}.self_attn.o_proj", attn)
            h = _rms_norm(params, f"{p}.post_attention_layernorm", x, self.eps)
            gate = jax.nn.silu(_linear(params, f"{p}.mlp.gate_proj", h))
            x = x + _linear(params, f"{p}.mlp.down_proj", gate * _linear(params, f"{p}.mlp.up_proj", h))
        x = _rms_norm(params, "model.norm", x[:, -1], self.eps)
        return _linear(params, "lm_head", x), (keys, values)

    def greedy(self, params, cache, ids, start):
        """The next token (argmax of the last logits) and the updated cache."""
        logits, cache = self.forward(params, cache, ids, start)
        return cache, jnp.argmax(logits, axis=-1).astype(ids.dtype)

    def greedy_loop(self, params, cache, token, start, count):
        """``count`` greedy steps from ``token`` at position ``start`` in one
        ``lax.fori_loop`` (``count`` is data: one program for any count); the cache and
        the tokens made, ``(batch, max_len)`` with the first ``count`` columns filled."""
        made = jnp.zeros((token.shape[0], self.max_len), token.dtype)

        def one(i, carry):
            cache, token, made = carry
            cache, token = self.greedy(params, cache, token[:, None], start + i)
            return cache, token, made.at[:, i].set(token)

        cache, _, made = jax.lax.fori_loop(0, count, one, (cache, token, made))
        return cache, made


def decode_loop(decoder: Decoder, params, prompt: np.ndarray, new_tokens: int, clock,
                compiled: dict, mode: str = "read"
                ) -> tuple[np.ndarray, list[float], int, float]:
    """Greedy tokens of a full decode: a prefill and a decode program compiled ahead of
    time (kept in ``compiled`` for later calls), the cache donated to each. ``mode``:
    ``"read"``, one step per token, each token read back as it comes (a streaming server);
    ``"launch"``, one step per token launched back to back, the tokens read once at the
    end; ``"device"``, every token after the first in one ``lax.fori_loop`` program
    (``Decoder.greedy_loop``), read at the end. Returns the tokens, [start, the clock time
    of the first token, of each later token read (``"read"``) or of the end], the
    programs compiled and the seconds spent compiling."""
    batch, length = prompt.shape
    ids = jnp.asarray(prompt)
    start = clock()
    before = len(compiled)
    compile_s = 0.0
    cache = decoder.empty_cache(batch)

    def program(name, fn, *example):
        nonlocal compile_s
        if name not in compiled:
            t0 = clock()
            compiled[name] = jax.jit(fn, donate_argnums=(1,)).lower(*example).compile()
            compile_s += clock() - t0
        return compiled[name]

    zero = jnp.int32(0)
    cache, token = program("prefill", decoder.greedy, params, cache, ids, zero)(
        params, cache, ids, zero)
    out = [np.asarray(token)]
    times = [clock()]
    position = jnp.int32(length)
    if mode == "device":
        count = jnp.int32(new_tokens - 1)
        loop = program("loop", decoder.greedy_loop, params, cache, token, position, count)
        cache, made = loop(params, cache, token, position, count)
        out += list(np.asarray(made)[:, :new_tokens - 1].T)
        times.append(clock())
    else:
        read_each = mode == "read"
        step = program("step", decoder.greedy, params, cache, token[:, None], position)
        for i in range(1, new_tokens):
            cache, token = step(params, cache, token[:, None], jnp.int32(length + i - 1))
            out.append(np.asarray(token) if read_each else token)
            if read_each:
                times.append(clock())
        if not read_each:
            out = [np.asarray(t) for t in out]
            times.append(clock())
    tokens = np.concatenate([prompt, np.stack(out, axis=1)], axis=1)
    return tokens, [start] + times, len(compiled) - before, compile_s
