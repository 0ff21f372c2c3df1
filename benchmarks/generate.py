"""Greedy ``generate`` of a tiny Hugging Face Llama on the spmd device vs on the CPU.

``generate`` reads a value every token (its stopping criteria), so it is the loop where a
read that ran only the graph it needs re-ran every earlier token's work and compiled an
ever larger graph (472 s of compiling for 16 tokens). A read now runs all pending work,
so each token's graph starts from data.

    python benchmarks/generate.py [--tokens 16] [--cache dynamic|static] [--layers 2]
        [--dim 64] [--prompt 8]

Prints the graphs compiled, the seconds spent compiling, how many graph nodes were
executed per aten op recorded, how many nodes ran a second time (an earlier token's work
done again) and whether the tokens equal CPU's.
Exits non-zero when they differ.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TORCHSPMD_CPU_DEVICES", "1")  # one device: this measures the loop

import torch  # noqa: E402

import torchspmd  # noqa: E402


def tiny_llama(layers: int, dim: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=dim, intermediate_size=2 * dim,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def generate(model, prompt: torch.Tensor, tokens: int, cache: str) -> torch.Tensor:
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=tokens, min_new_tokens=tokens, **extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    model = tiny_llama(args.layers, args.dim)
    prompt = torch.randint(3, 128, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    expected = generate(model, prompt, args.tokens, args.cache)

    model.to(torchspmd.device())
    torchspmd.reset_metrics()
    start = time.perf_counter()
    actual = generate(model, prompt.to(torchspmd.device()), args.tokens, args.cache).cpu()
    wall = time.perf_counter() - start
    m = torchspmd.metrics()
    equal = torch.equal(actual, expected)
    print(f"tiny Llama ({args.layers} layers, dim {args.dim}), {args.cache} cache, "
          f"prompt {args.prompt}, {args.tokens} new tokens")
    print(f"graphs compiled: {m['graphs_compiled']}")
    print(f"compile seconds: {m['compile_time_s']:.2f} (wall {wall:.2f} s)")
    print(f"ops executed / recorded: {m['ops_executed'] / max(m['ops_traced'], 1):.2f} "
          f"({m['ops_executed']} / {m['ops_traced']}; graph nodes that are not aten calls, "
          "such as casts and sharding constraints, count as executed only)")
    print(f"ops run again: {m['ops_rerun']}")
    print(f"tokens equal CPU: {'PASS' if equal else 'FAIL'}")
    if not equal:
        print(f"cpu:  {expected.tolist()}\nspmd: {actual.tolist()}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
