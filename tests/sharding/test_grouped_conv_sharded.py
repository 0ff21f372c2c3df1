"""Grouped and depthwise convolutions under batch and channel sharding: CPU's input, weight
and bias gradients.

XLA's SPMD partitioner miscompiles the weight gradient of a grouped convolution (a
convolution with ``batch_group_count > 1``, what ``jax.vjp`` of a ``feature_group_count``
convolution emits) when the batch is sharded; plain JAX reproduces it (last test). The
lowering of ``convolution_backward`` computes that gradient as einsums instead
(``lowering/conv.py``), so no such convolution reaches XLA.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEVICE = torchspmd.device()
C, N = 8, 8
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}


def _cases(nd):
    """(name, fn, weight shape, bias size): groups 1, 2, 4 and C (depthwise), with stride,
    padding and dilation variants and transposed convolutions (their weight gradient takes
    the same path)."""
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    conv_t = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
    k = (3,) * nd if nd < 3 else (2, 3, 2)  # 3-d: fewer kernel offsets, less to compile
    cases = {
        "g1": (lambda x, w, b: conv(x, w, b, padding=1), (C, C) + k, C),
        "g2 stride2 dilation2": (lambda x, w, b: conv(x, w, b, stride=2, padding=2, dilation=2, groups=2),
                                 (C, C // 2) + k, C),
        "g4 transposed": (lambda x, w, b: conv_t(x, w, b, stride=2, padding=1, output_padding=1, groups=4),
                          (C, 2) + k, 8),
        "depthwise stride2": (lambda x, w, b: conv(x, w, b, stride=2, padding=1, groups=C), (C, 1) + k, C),
        "depthwise transposed": (lambda x, w, b: conv_t(x, w, b, stride=1, padding=1, groups=C),
                                 (C, 1) + k, C),
    }
    if nd == 3:
        cases = {n: cases[n] for n in ("g2 stride2 dilation2", "depthwise stride2", "g4 transposed")}
    return cases


def _grads(device, nd, mesh=None, spec=None, names=None):
    """Input, weight and bias gradients of every case (or those ``names``), in one graph."""
    gen = torch.Generator().manual_seed(nd)
    loss, leaves = 0, {}
    for name, (fn, wshape, bias) in _cases(nd).items():
        x, w, b = (torch.randn(s, generator=gen) for s in ((N, C) + SPATIAL[nd], wshape, (bias,)))
        if names is not None and name not in names:
            continue  # drawn all the same: each case gets the same values on every run
        x, w, b = (t.to(device).requires_grad_() for t in (x, w, b))
        if mesh is not None:
            torchspmd.mark_sharding(x, mesh, spec + (None,) * nd)
            if spec[1] is not None:  # channel sharding: the weight's first dim too
                torchspmd.mark_sharding(w, mesh, ("model",) + (None,) * (w.dim() - 1))
        out = fn(x, w, b)
        # The output gradient is then ``out``, sharded like it (a replicated one, e.g. of
        # ``(out * constant).sum()``, hides the miscompile).
        loss = loss + (out * out).sum() / 2
        leaves[name] = (x, w, b)
    loss.backward()
    return {name: [t.grad.cpu() for t in ts] for name, ts in leaves.items()}


MESH_SPECS = {"batch": ("data", None), "batch+channels": ("data", "model")}


@pytest.mark.parametrize("nd", [1, 2, 3], ids=["conv1d", "conv2d", "conv3d"])
def test_grouped_conv_gradients_under_sharding_equal_cpu(nd):
    # Channel sharding (x on ("data", "model", ...), weights on out-channels) was right
    # before; it is checked on two conv2d cases that the einsum route keeps it right.
    mesh = torchspmd.Mesh(np.arange(8), (4, 2), ("data", "model"))
    expected = _grads("cpu", nd)
    runs = [("batch", None)] + ([("batch+channels", ("g2 stride2 dilation2", "depthwise stride2"))]
                                if nd == 2 else [])
    for sharding, names in runs:
        got = _grads(DEVICE, nd, mesh, MESH_SPECS[sharding], names)
        for name in got:
            grads = expected[name]
            for which, g, e in zip(("input", "weight", "bias"), got[name], grads):
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4,
                                           msg=lambda m: f"{sharding} {name} {which}: {m}")


def test_xla_still_miscompiles_a_batch_sharded_grouped_conv_weight_gradient():
    """Plain JAX, no torchspmd. When this test fails, XLA is fixed: drop ``_grouped_weight_grad``
    in ``lowering/conv.py`` (take ``jax.vjp``'s weight gradient for every ``groups``) and this test."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, 6, 6)).astype(np.float32)
    w = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)

    def loss(w, x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)], feature_group_count=C,
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"), precision="highest")
        return jnp.sum(y * y) / 2

    expected = jax.grad(loss)(w, x)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    got = jax.jit(jax.grad(loss))(w, sharded)
    assert not np.allclose(got, expected, rtol=1e-3, atol=1e-3)
