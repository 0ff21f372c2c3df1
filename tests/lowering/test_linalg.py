"""Linear-algebra lowerings against CPU PyTorch."""

import contextlib

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from tests.lowering import helpers
from tests.lowering.helpers import to_jax, to_torch
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.lowering.registry import LOWERINGS

aten = torch.ops.aten


@contextlib.contextmanager
def jitted(op):
    """Run ``op``'s lowering under ``jax.jit`` (arrays traced, the rest static), as the runtime does.

    One compile per call instead of one per JAX op in eager mode, and Python control flow on a
    traced value fails loudly.
    """
    fn = LOWERINGS[op]

    def traced(meta, *args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        where = [i for i, v in enumerate(leaves) if isinstance(v, jax.Array)]

        def body(arrays):
            full = list(leaves)
            for i, a in zip(where, arrays):
                full[i] = a
            a, k = tree_unflatten(full, spec)
            return fn(meta, *a, **k)

        return jax.jit(body)([leaves[i] for i in where])

    LOWERINGS[op] = traced
    try:
        yield
    finally:
        LOWERINGS[op] = fn


def check_lowering(op, *args, **kwargs):
    with jitted(op):
        helpers.check_lowering(op, *args, **kwargs)


def run_lowering(op, *args, **kwargs):
    with jitted(op):
        return helpers.run_lowering(op, *args, **kwargs)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


CASES = {
    "mm": (aten.mm.default, lambda: (r(3, 4), r(4, 5)), {}),
    "bmm": (aten.bmm.default, lambda: (r(2, 3, 4), r(2, 4, 5)), {}),
    "dot": (aten.dot.default, lambda: (r(7), r(7)), {}),
    "mv": (aten.mv.default, lambda: (r(3, 4), r(4)), {}),
    "addmm": (aten.addmm.default, lambda: (r(3, 5), r(3, 4), r(4, 5)), {"beta": 0.5, "alpha": 2}),
    "addmm_bias_row": (aten.addmm.default, lambda: (r(5), r(3, 4), r(4, 5)), {}),
    "baddbmm": (aten.baddbmm.default, lambda: (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {"beta": 0.5, "alpha": 2}),
    "addbmm": (aten.addbmm.default, lambda: (r(3, 5), r(2, 3, 4), r(2, 4, 5)), {"beta": 2, "alpha": 0.5}),
    "addmv": (aten.addmv.default, lambda: (r(3), r(3, 4), r(4)), {"beta": 0.5, "alpha": 2}),
    "addr": (aten.addr.default, lambda: (r(3, 4), r(3), r(4)), {"beta": 0.5, "alpha": 2}),
    "addmm_relu": (aten._addmm_activation.default, lambda: (r(5), r(3, 4), r(4, 5)), {}),
    "addmm_gelu": (aten._addmm_activation.default, lambda: (r(5), r(3, 4), r(4, 5)), {"use_gelu": True}),
    # F.bilinear(x1 (3,4), x2 (3,5), w (6,4,5)) as it reaches dispatch
    "trilinear": (aten._trilinear.default, lambda: (r(3, 4), r(6, 4, 5), r(3, 5), [1, 3], [0], [1, 2], [2, 3]), {}),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_cpu(name, dtype):
    op, make, kwargs = CASES[name]
    args = [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in make()]
    check_lowering(op, *args, **kwargs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["mm", "bmm", "addmm", "baddbmm"])
def test_bfloat16_accumulates_in_float32(name):
    op, make, kwargs = CASES[name]
    args = [a.to(torch.bfloat16) for a in make()]
    check_lowering(op, *args, **kwargs, atol=1e-2, rtol=1e-2)


def test_integer_mm():
    check_lowering(aten.mm.default, torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2)))


@pytest.mark.parametrize("name", ["addmm", "baddbmm", "addbmm", "addmv", "addr"])
def test_scalars_as_traced_arrays(name):
    """beta/alpha arrive as 0-d graph inputs: no Python branching on their value under jit."""
    op, make, kwargs = CASES[name]
    args = make()
    expected = op(*args, **kwargs)
    meta = jax.ShapeDtypeStruct(tuple(expected.shape), to_jax_dtype(expected.dtype))
    fn = jax.jit(lambda xs, b, a: LOWERINGS[op](meta, *xs, beta=b, alpha=a))
    out = fn([to_jax(a) for a in args], jnp.asarray(kwargs["beta"]), jnp.asarray(kwargs["alpha"]))
    assert out.dtype == meta.dtype
    torch.testing.assert_close(to_torch(out), expected)


def test_addmm_beta_zero_ignores_nan_self():
    self = torch.full((3, 5), float("nan"))
    check_lowering(aten.addmm.default, self, r(3, 4), r(4, 5), beta=0)


def test_trilinear_is_bilinear():
    x1, x2, w = r(3, 4), r(3, 5), r(6, 4, 5)
    out = run_lowering(aten._trilinear.default, x1, w, x2, [1, 3], [0], [1, 2], [2, 3])
    torch.testing.assert_close(out, torch.nn.functional.bilinear(x1, x2, w), atol=1e-5, rtol=1e-5)
