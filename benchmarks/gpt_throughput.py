"""Tokens/s and model FLOPs utilisation of ``examples/train_gpt.py`` on this machine.

    python benchmarks/gpt_throughput.py [--peak-tflops T] [train_gpt.py arguments...]

Runs the example (its own arguments pass through) and prints one line
``GPT {json}``: tokens/s at the median step, step and host ms, compiles, and MFU =
6 x parameters x tokens/s / peak FLOP/s (the usual estimate: forward + backward matmuls,
attention's own FLOPs left out). The peak defaults to the device's dense peak for the
matmuls' type where known: bfloat16 tensor cores with ``--autocast bf16``, else plain
float32 (torchspmd asks XLA for full float32 precision, as PyTorch's default
``torch.get_float32_matmul_precision() == "highest"`` does, so no TF32); none on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

# Dense peaks (TFLOP/s) from NVIDIA's data sheets (SXM parts): float32 without tensor
# cores, bfloat16 with.
PEAK_TFLOPS = {"H100": {"float32": 66.9, "bfloat16": 989.4},
               "H200": {"float32": 66.9, "bfloat16": 989.4},
               "A100": {"float32": 19.5, "bfloat16": 312.0},
               "L4": {"float32": 30.3, "bfloat16": 121.0}}


def peak_tflops(device_kind: str, dtype: str = "float32") -> float | None:
    """The dense ``dtype`` matmul peak of a device kind like ``NVIDIA H100 80GB HBM3``.

    >>> peak_tflops("NVIDIA H200", "bfloat16"), peak_tflops("cpu")
    (989.4, None)
    """
    return next((v[dtype] for k, v in PEAK_TFLOPS.items() if k in device_kind), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-tflops", type=float, default=None)
    args, rest = parser.parse_known_args(argv)
    import jax
    import train_gpt  # configures torchspmd (and so JAX's devices) at import

    result = train_gpt.main(rest)
    model_args = train_gpt.parse_args(rest)
    kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or peak_tflops(kind, "bfloat16" if model_args.autocast else "float32")
    # Non-embedding parameters, as MFU estimates count them: 12 d^2 per block
    # (attention 4 d^2, MLP 8 d^2).
    params = 12 * model_args.layers * model_args.dim ** 2
    flops = 6 * params * result.tokens_per_s
    print("GPT " + json.dumps({
        "device": f"{jax.device_count()} x {kind}", "tokens_per_s": result.tokens_per_s,
        "step_ms": result.median_step_s * 1e3, "host_ms": result.median_host_s * 1e3,
        "compiles": result.compiles, "parameters": params,
        "matmuls": "bfloat16" if model_args.autocast else "float32",
        "mfu": None if peak is None else flops / (peak * 1e12), "peak_tflops": peak}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
