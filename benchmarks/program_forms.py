"""Program sizes of the forms behind torchspmd's differences from JAX's step (no timing).

Two questions from docs/performance.md, answered with XLA's optimized HLO
(``torchspmd.debug.program_size``; deterministic, whatever the machine's load):

* weight gradients: PyTorch's ``mm(grad_2d.t(), input_2d)`` against JAX's contraction of
  the 3-d activations -- which kernels XLA's backend makes of each;
* AdamW's step counters: one per parameter (PyTorch's state) against one shared input,
  with N outputs or one -- how much of the per-parameter scalar math XLA's CSE removes.

    python benchmarks/program_forms.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import torchspmd  # noqa: F401  (configures JAX's devices)
from torchspmd.debug import program_size

HIGHEST = jax.lax.Precision.HIGHEST
PARAMETERS = 12


def weight_gradient_forms() -> dict:
    """Weight gradient of a Linear on [8, 32, in] activations, written three ways."""
    def torch_form(g, x):  # mm(grad.t(), input) on the flattened activations
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        return jax.lax.dot_general(g2.T, x2, (((1,), (0,)), ((), ())), precision=HIGHEST)

    def jax_form(g, x):  # jax.grad of x @ w.T: contracts batch and sequence
        return jax.lax.dot_general(g, x, (((0, 1), (0, 1)), ((), ())), precision=HIGHEST)

    g, x = np.ones((8, 32, 256), np.float32), np.ones((8, 32, 64), np.float32)
    return {name: program_size(jax.jit(f).lower(g, x).compile().as_text())
            for name, f in (("mm(grad.t(), input) [torchspmd]", torch_form),
                            ("3-d contraction [JAX]", jax_form))}


def _adamw(params, grads, m, v, steps, lr):
    out = []
    for p, g, mi, vi, s in zip(params, grads, m, v, steps):
        s = s + 1
        mi = mi + (g - mi) * 0.1
        vi = vi * 0.999 + g * g * 0.001
        bias1, bias2 = 1 - 0.9 ** s, 1 - 0.999 ** s
        p = p * (1 - lr * 0.1) - (lr / bias1) * mi / (jnp.sqrt(vi) / jnp.sqrt(bias2) + 1e-8)
        out.append((p, mi, vi, s))
    return out


def step_counter_forms() -> dict:
    """AdamW over 12 parameters with the step counters held three ways."""
    n = PARAMETERS
    forms = {
        "a counter per parameter [PyTorch state]": (
            lambda p, g, m, v, s, lr: _adamw(p, g, m, v, s, lr), True),
        "one counter input, N counter outputs": (
            lambda p, g, m, v, s, lr: _adamw(p, g, m, v, [s] * n, lr), False),
        "one counter input, one output [JAX]": (
            lambda p, g, m, v, s, lr: [o[:3] for o in _adamw(p, g, m, v, [s] * n, lr)] + [s + 1],
            False),
    }
    sizes = {}
    for name, (f, per_parameter) in forms.items():
        def tree():
            return [np.full((256, 64), 0.5, np.float32) for _ in range(n)]
        steps = [np.float32(3)] * n if per_parameter else np.float32(3)
        lowered = jax.jit(f).lower(tree(), tree(), tree(), tree(), steps, np.float32(1e-3))
        sizes[name] = program_size(lowered.compile().as_text())
    return sizes


def main() -> None:
    for title, sizes in (("weight gradient of one Linear", weight_gradient_forms()),
                         (f"AdamW, {PARAMETERS} parameters", step_counter_forms())):
        print(f"{title}:")
        print(f"  {'form':42}{'params':>7}{'outputs':>8}{'fusions':>8}{'copies':>7}"
              f"{'dots':>5}{'instructions':>13}")
        for name, s in sizes.items():
            print(f"  {name:42}{s.parameters:7d}{s.outputs:8d}{s.fusions:8d}{s.copies:7d}"
                  f"{s.dots:5d}{s.instructions:13d}")


if __name__ == "__main__":
    main()
