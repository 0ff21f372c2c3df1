"""Greedy ``generate`` of a Hugging Face Llama: torchspmd vs CPU eager vs a pure-JAX decode loop.

torchspmd runs the unchanged ``model.generate(..., cache_implementation="static")`` after
``torchspmd.generation.compile_generate(model)``; the JAX loop (``jax_llama.py``) is the
same model with the same weights, a jitted prefill and a jitted decode step over a static
KV cache. In one run, per model and system, it prints: programs compiled, compile
seconds, time to first token (compile included, first call) and warm milliseconds per
token.

Rows: ``torchspmd`` (greedy: the tokens after the first made by one loop on the device,
read at the end, ``generation/greedy.py``), ``+streamer`` (the same calls with a
streamer, which makes ``generate`` run its own loop: each token reaches the host as it is
made), ``pure JAX`` (one step per token, launched back to back, tokens read at the end:
the baseline of the ratios), ``JAX, read`` (each token read back as it comes, as a
streaming server does) and ``JAX, loop`` (every token after the first in one
``lax.fori_loop`` program, as torchspmd's greedy loop).

Without a streamer, the first token's time is a cold call of one token, and a token's
(T(tokens) - T(1)) / (tokens - 1) of warm calls (the median of three); with one, the
times the tokens reach the host; on the JAX side, the clock after the first token and
after the last.

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
import statistics
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
REPEATS = 3  # warm measurements per system: the median is printed


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


def hf_generate(model, prompt, tokens, streamer=None):
    """(tokens on the host, [start, the time of each new token (with a streamer: as it
    reaches the host) or of the end (the tokens read back)])."""
    mask = torch.ones(prompt.shape, dtype=torch.long).to(prompt.device)  # host data, no program
    start = clock()
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=mask, do_sample=False,
                             max_new_tokens=tokens, min_new_tokens=tokens,
                             cache_implementation="static", streamer=streamer)
    out = out.cpu()
    return out, [start] + (streamer.times if streamer is not None else [clock()])


def hf_timings(model, prompt, tokens, streamer: bool):
    """(tokens, first-token seconds of a cold call, warm seconds per token after the first:
    the median of ``REPEATS`` measurements).

    With a streamer, from the times the tokens reach the host. Without, from whole calls:
    the cold call of one token is the time to the first; per token, (T(tokens) - T(1)) /
    (tokens - 1) of warm calls. ``generate`` compiles its decode step in the first call
    of ``tokens``."""
    if streamer:
        out, cold = hf_generate(model, prompt, tokens, Clock())
        warms = [hf_generate(model, prompt, tokens, Clock())[1] for _ in range(REPEATS)]
        return out, cold[1] - cold[0], statistics.median(
            (warm[-1] - warm[1]) / max(len(warm) - 2, 1) for warm in warms)
    _, one = hf_generate(model, prompt, 1)
    out, _ = hf_generate(model, prompt, tokens)
    per_token = []
    for _ in range(REPEATS):
        _, warm_one = hf_generate(model, prompt, 1)
        _, warm = hf_generate(model, prompt, tokens)
        per_token.append(((warm[-1] - warm[0]) - (warm_one[-1] - warm_one[0]))
                         / max(tokens - 1, 1))
    return out, one[-1] - one[0], statistics.median(per_token)


def jax_summary(cold, warms, tokens):
    return cold[1] - cold[0], statistics.median((w[-1] - w[1]) / max(tokens - 1, 1)
                                                for w in warms)


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
    prompt = torch.randint(3, shape[4], (1, args.prompt),
                           generator=torch.Generator().manual_seed(1))
    rows = []

    expected, ttft, warm = hf_timings(cpu, prompt, args.tokens, streamer=False)
    rows.append(("CPU eager", 0, 0.0, ttft, warm, True))

    model = copy.deepcopy(cpu).to(torchspmd.device())
    if args.devices > 1:
        torchspmd.generation.parallelize_hf(model, torchspmd.Mesh(list(range(args.devices)),
                                                                  (args.devices,), ("model",)))
    # One cache length for every call (the one-token calls' too), as the JAX loop has.
    cache_length = torchspmd.generation.Buckets().cache(args.prompt + args.tokens)
    torchspmd.generation.compile_generate(model, cache_multiple=cache_length)
    device_prompt = prompt.to(torchspmd.device())
    torchspmd.sync()
    ok = True
    for name, streamer in (("torchspmd", False), ("+streamer", True)):
        torchspmd.reset_metrics()
        actual, ttft, warm = hf_timings(model, device_prompt, args.tokens, streamer)
        m = torchspmd.metrics()
        same = torch.equal(actual, expected)
        ok &= same
        rows.append((name, m["graphs_compiled"], m["compile_time_s"], ttft, warm, same))
        if not streamer:
            loops, rerun = m["generate_device_loops"], m["ops_rerun"]

    params = params_from_torch(cpu.state_dict())
    if args.devices > 1:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:args.devices]), ("model",))
        params = jax_tp_params(params, mesh)
    decoder = Decoder.of(cpu.config, max_len=cache_length)
    jax_rows = []
    for name, mode in (("pure JAX", "launch"), ("JAX, read", "read"),
                       ("JAX, loop", "device")):
        compiled: dict = {}  # each variant compiles its own programs (jit's cache would not)
        tokens, cold, programs, compile_s = decode_loop(decoder, params, prompt.numpy(),
                                                        args.tokens, clock, compiled, mode)
        warm = [decode_loop(decoder, params, prompt.numpy(), args.tokens, clock, compiled,
                            mode)[1] for _ in range(REPEATS)]
        jax_ok = np.array_equal(tokens, expected.numpy())
        ok &= jax_ok
        jax_rows.append((name, programs, compile_s, *jax_summary(cold, warm, args.tokens),
                         jax_ok))
    rows += jax_rows

    jax_ttft, jax_warm = jax_rows[0][3], jax_rows[0][4]
    print(f"\n{label}: Llama {shape[0]} layers, dim {shape[1]}, {shape[2]} heads "
          f"({shape[3]} kv), vocab {shape[4]}; prompt {args.prompt}, {args.tokens} greedy tokens, "
          f"{args.devices} device(s){' (TP)' if args.devices > 1 else ''}")
    print(f"{'system':<10} | programs | compile s | first token ms | warm ms/token | "
          f"vs JAX (ttft, warm) | tokens = CPU")
    for name, programs, compile_s, ttft, warm_ms, same in rows:
        print(f"{name:<10} | {programs:>8} | {compile_s:>9.2f} | {ttft * 1e3:>14.1f} | "
              f"{warm_ms * 1e3:>13.3f} | {ttft / jax_ttft:>6.2f}x, {warm_ms / jax_warm:>6.2f}x    | "
              f"{'PASS' if same else 'FAIL'}")
    print(f"torchspmd: ops run again: {rerun}; greedy loops on the device: {loops} of "
          f"{2 + 2 * REPEATS} calls (the streamer's calls run generate's own loop); tokens "
          f"equal CPU: {'PASS' if ok else 'FAIL'}")
    return ok


def warm_up_process() -> None:
    """One tiny program on each side first: the first compile in a process pays one-time
    set-up (XLA's and LLVM's) that would otherwise land on whichever side runs first."""
    (torch.ones(2).to(torchspmd.device()) * 2).cpu()
    jax.block_until_ready(jax.jit(lambda x: x * 2)(np.ones(2, np.float32)))


def main(args) -> int:
    torch.set_num_threads(1)
    warm_up_process()
    if args.layers or args.dim:
        layers, dim = args.layers or 2, args.dim or 64
        models = {"custom": (layers, dim, 4, 2, 128)}
    else:
        models = {name: MODELS[name] for name in args.models.split(",")}
    ok = all([run_model(label, shape, args) for label, shape in models.items()])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
