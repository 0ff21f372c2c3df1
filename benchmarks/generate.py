"""Greedy ``generate`` of a Hugging Face Llama: torchspmd vs CPU eager vs a pure-JAX decode loop.

torchspmd runs the unchanged ``model.generate(..., cache_implementation="static")`` after
``torchspmd.generation.compile_generate(model)``; the JAX loop (``jax_llama.py``) is the
same model with the same weights, a jitted prefill and a jitted decode step over a static
KV cache. In one run, per model and system, it prints: programs compiled, compile
seconds, time to first token (compile included, first call) and warm milliseconds per
token (a second call: the time between the first and the last new token over the tokens
in between). Tokens arrive through a streamer on the HF side and as a read per token on
the JAX side, so both loops see every token on the host as it is made.

    python benchmarks/generate.py [--tokens 256] [--prompt 8] [--devices 1]
        [--models tiny,large] [--layers L --dim D]

``--devices N`` (N > 1) runs both torchspmd and JAX tensor-parallel over N CPU devices
(HF's own ``base_model_tp_plan`` on torchspmd, the same partition of the same weights on
JAX). ``--layers/--dim`` replace the models with one of that size. Exits non-zero when
torchspmd's or JAX's tokens differ from CPU's. Numbers from a shared, loaded machine are
noisy: compare the ratios to JAX within one run.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

MODELS = {  # name: (layers, dim, heads, kv_heads, vocab)
    "tiny": (2, 64, 4, 2, 128),
    "large": (8, 512, 8, 4, 1024),
}


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--models", default="tiny,large")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dim", type=int)
    return parser.parse_args(argv)


ARGS = parse(sys.argv[1:] if __name__ == "__main__" else [])
os.environ.setdefault("TORCHSPMD_CPU_DEVICES", str(ARGS.devices))  # before JAX starts
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # this checkout's torchspmd, and jax_llama

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import torchspmd  # noqa: E402
import torchspmd.generation  # noqa: E402

from jax_llama import Decoder, decode_loop, params_from_torch  # noqa: E402

clock = time.perf_counter


def llama(layers: int, dim: int, heads: int, kv_heads: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=2 * dim,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=4096,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


class Clock:
    """A streamer that notes when each new token reaches the host (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []
        self._prompt = True

    def put(self, value):
        if self._prompt:
            self._prompt = False
        else:
            self.times.append(clock())

    def end(self):
        pass


def hf_generate(model, prompt, tokens):
    """(tokens on the host, [start, time of each new token])."""
    streamer = Clock()
    mask = torch.ones(prompt.shape, dtype=torch.long).to(prompt.device)  # host data, no program
    start = clock()
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=mask, do_sample=False,
                             max_new_tokens=tokens, min_new_tokens=tokens,
                             cache_implementation="static", streamer=streamer)
    return out.cpu(), [start] + streamer.times


def summary(times_cold, times_warm):
    ttft = times_cold[1] - times_cold[0]
    warm = (times_warm[-1] - times_warm[1]) / max(len(times_warm) - 2, 1)
    return ttft, warm


def jax_tp_params(params, mesh):
    """The weights partitioned as HF's Llama plan: q/k/v/gate/up by output features,
    o/down by input features, the rest replicated."""
    out = {}
    for name, value in params.items():
        spec = P()
        if any(k in name for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            spec = P("model", None)
        elif any(k in name for k in ("o_proj", "down_proj")):
            spec = P(None, "model")
        out[name] = jax.device_put(value, NamedSharding(mesh, spec))
    return out


def run_model(label, shape, args) -> bool:
    cpu = llama(*shape)
    prompt = torch.randint(3, shape[4], (1, args.prompt), generator=torch.Generator().manual_seed(1))
    rows = []

    expected, cold = hf_generate(cpu, prompt, args.tokens)
    _, warm = hf_generate(cpu, prompt, args.tokens)
    rows.append(("CPU eager", 0, 0.0, *summary(cold, warm), True))

    model = copy.deepcopy(cpu).to(torchspmd.device())
    if args.devices > 1:
        torchspmd.generation.parallelize_hf(model, torchspmd.Mesh(list(range(args.devices)),
                                                                  (args.devices,), ("model",)))
    torchspmd.generation.compile_generate(model)
    device_prompt = prompt.to(torchspmd.device())
    torchspmd.sync()
    torchspmd.reset_metrics()
    actual, cold = hf_generate(model, device_prompt, args.tokens)
    m = torchspmd.metrics()
    _, warm = hf_generate(model, device_prompt, args.tokens)
    spmd_ok = torch.equal(actual, expected)
    rows.append(("torchspmd", m["graphs_compiled"], m["compile_time_s"], *summary(cold, warm),
                 spmd_ok))

    params = params_from_torch(cpu.state_dict())
    cache_sharding = None
    if args.devices > 1:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:args.devices]), ("model",))
        params = jax_tp_params(params, mesh)
    decoder = Decoder.of(cpu.config, max_len=torchspmd.generation.Buckets().cache(
        args.prompt + args.tokens))
    compiled: dict = {}
    tokens, cold, programs, compile_s = decode_loop(decoder, params, prompt.numpy(), args.tokens,
                                                    clock, compiled)
    _, warm, _, _ = decode_loop(decoder, params, prompt.numpy(), args.tokens, clock, compiled)
    jax_ok = np.array_equal(tokens, expected.numpy())
    rows.append(("pure JAX", programs, compile_s, *summary(cold, warm), jax_ok))

    jax_ttft, jax_warm = rows[-1][3], rows[-1][4]
    print(f"\n{label}: Llama {shape[0]} layers, dim {shape[1]}, {shape[2]} heads "
          f"({shape[3]} kv), vocab {shape[4]}; prompt {args.prompt}, {args.tokens} greedy tokens, "
          f"{args.devices} device(s){' (TP)' if args.devices > 1 else ''}")
    print(f"{'system':<10} | programs | compile s | first token ms | warm ms/token | "
          f"vs JAX (ttft, warm) | tokens = CPU")
    for name, programs, compile_s, ttft, warm_ms, ok in rows:
        print(f"{name:<10} | {programs:>8} | {compile_s:>9.2f} | {ttft * 1e3:>14.1f} | "
              f"{warm_ms * 1e3:>13.3f} | {ttft / jax_ttft:>6.2f}x, {warm_ms / jax_warm:>6.2f}x    | "
              f"{'PASS' if ok else 'FAIL'}")
    print(f"torchspmd: ops run again: {m['ops_rerun']}; decode steps replayed: "
          f"{m['step_replays']}; tokens equal CPU: {'PASS' if spmd_ok else 'FAIL'}")
    return spmd_ok and jax_ok


def main(args) -> int:
    torch.set_num_threads(1)
    if args.layers or args.dim:
        layers, dim = args.layers or 2, args.dim or 64
        models = {"custom": (layers, dim, 4, 2, 128)}
    else:
        models = {name: MODELS[name] for name in args.models.split(",")}
    ok = all([run_model(label, shape, args) for label, shape in models.items()])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
