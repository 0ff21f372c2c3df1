"""Run one aten overload's lowering on JAX copies of CPU inputs, and compare with CPU PyTorch.

Used by the per-family lowering tests: they check the pure JAX functions without the
spmd device, so a lowering bug is found where it lives.
"""

import jax
import numpy as np
import torch
from torch.utils._pytree import tree_map

import torchspmd.jax_setup  # noqa: F401  (x64 and CPU devices before JAX starts)
import torchspmd.lowering  # noqa: F401  (fills the table)
from torchspmd.lowering.dtypes import to_jax_dtype, to_torch_dtype
from torchspmd.lowering.registry import LOWERINGS, META_FUNCTIONS, RANDOM_OPS


def to_jax(t: torch.Tensor) -> jax.Array:
    if t.dtype == torch.bfloat16:
        return jax.numpy.asarray(t.float().numpy()).astype(jax.numpy.bfloat16)
    return jax.numpy.asarray(t.detach().numpy())


def to_torch(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == jax.numpy.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a.copy()).to(to_torch_dtype(a.dtype))


def _meta_of(out):
    if isinstance(out, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(out.shape), to_jax_dtype(out.dtype))
    if isinstance(out, (tuple, list)):
        return tuple(_meta_of(o) for o in out)
    return None


def run_lowering(op, *args, key=None, **kwargs):
    """The lowering's result for ``op(*args, **kwargs)``, as CPU torch tensors."""
    infer = META_FUNCTIONS.get(op, op)  # ops PyTorch has no meta kernel for
    meta = _meta_of(infer(*tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, args),
                       **tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, kwargs)))
    jargs = tree_map(lambda t: to_jax(t) if isinstance(t, torch.Tensor) else t, args)
    jkwargs = tree_map(lambda t: to_jax(t) if isinstance(t, torch.Tensor) else t, kwargs)
    if op in RANDOM_OPS:
        jkwargs["key"] = key if key is not None else jax.random.key(0)
    out = LOWERINGS[op](meta, *jargs, **jkwargs)
    return tree_map(lambda a: to_torch(a) if isinstance(a, jax.Array) else a, out)


def check_lowering(op, *args, atol=1e-5, rtol=1e-5, **kwargs):
    """Assert the lowering of ``op`` matches CPU PyTorch (values, shape and dtype)."""
    expected = op(*args, **kwargs)
    actual = run_lowering(op, *args, **kwargs)
    exp_leaves = expected if isinstance(expected, (tuple, list)) else [expected]
    act_leaves = actual if isinstance(actual, (tuple, list)) else [actual]
    assert len(exp_leaves) == len(act_leaves), (op, len(exp_leaves), len(act_leaves))
    for e, a in zip(exp_leaves, act_leaves):
        if not isinstance(e, torch.Tensor):
            continue
        assert a.dtype == e.dtype, (op, a.dtype, e.dtype)
        assert a.shape == e.shape, (op, a.shape, e.shape)
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)


def samplers(seed: int):
    """``randn(*shape, dtype=)``, ``randint(*shape, lo=, hi=, dtype=)`` and
    ``uniform(lo, hi, *shape)`` drawing from one generator seeded with ``seed``, so a test
    module's inputs are reproducible."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    def randint(*shape, lo=-5, hi=6, dtype=torch.int64):
        return torch.randint(lo, hi, shape, generator=g, dtype=dtype)

    def uniform(lo, hi, *shape):
        return torch.rand(*shape, generator=g) * (hi - lo) + lo

    return randn, randint, uniform
