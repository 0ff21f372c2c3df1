"""Convolutions XLA gets wrong, each reproduced in plain JAX in a subprocess (some abort it).

XLA aborts the process (a CHECK failure in its SPMD partitioner) on the gradient of a
strided convolution whose input is sharded over a spatial dim. Plain JAX reproduces it,
so torchspmd cannot catch it: the limit is documented (docs/limits.md), and the fuzzer
shards convolutions over batch and channels only.

When this test fails, XLA is fixed: drop the limit and let the fuzzer draw spatial specs
again (``torchspmd/testing/fuzz/ops.py: convolution``).
"""

import subprocess
import sys
import textwrap

REPRO = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    x = np.ones((4, 2, 4, 3, 4), np.float32)
    w = np.ones((2, 2, 2, 3, 1), np.float32)
    def loss(x, w):
        y = jax.lax.conv_general_dilated(x, w, (STRIDE,) * 3, [(1, 1)] * 3)
        return (y * y).sum()
    x = jax.device_put(x, NamedSharding(mesh, P(None, None, "b", None, "a")))
    jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    print("survived")
""")


def run(stride: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REPRO.replace("STRIDE", str(stride))],
                          capture_output=True, text=True, timeout=300)


def test_xla_still_aborts_on_a_strided_conv_gradient_with_spatial_sharding():
    done = run(2)
    assert done.returncode != 0 and "Check failed" in done.stderr, done.stdout + done.stderr


def test_the_same_convolution_without_a_stride_partitions():
    done = run(1)
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr


UNSHARDED = textwrap.dedent("""
    import jax, numpy as np
    x = np.ones((2, 1, 3, 6), np.float32)
    w = np.ones((2, 1, 3, 2), np.float32)
    def loss(x, w):
        y = jax.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)])
        return (y * y).sum()
    jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    print("survived")
""")


def test_xla_cpu_still_aborts_on_this_strided_conv2d_gradient_even_unsharded():
    """Found by the fuzzer (seed 0, program 2700): XLA's algebraic simplifier CHECK-fails
    ("Window dimensions do not match RHS shape") on the gradient of a stride-2 conv2d with
    a 3x2 kernel, padding 1, on a 3x6 input, with no sharding at all. torchspmd lowers
    conv2d's input gradient and transposed convolutions through an explicit interior pad on
    CPU instead (lowering/conv.py; tests/lowering/test_conv.py runs these shapes). When this
    test fails, XLA is fixed: drop that branch of ``_conv``."""
    done = subprocess.run([sys.executable, "-c", UNSHARDED], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "Check failed" in done.stderr, done.stdout + done.stderr


GROUPED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    x = np.ones((4, 8, 3), np.float32)
    w = np.ones((8, 2, 3), np.float32)
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (2,), [(0, 0)], feature_group_count=4,
                                                     dimension_numbers=("NCH", "OIH", "NCH"))
    x = jax.device_put(x, NamedSharding(mesh, P(None, ("b", "a"), None)))
    try:
        jax.jit(conv)(x, w)
        print("survived")
    except Exception as e:
        print("raised:", e)
""")


def test_xla_still_rejects_a_grouped_conv_with_more_channel_shards_than_groups():
    """Found by the fuzzer (seed 0, program 2853): 8 input channels in 4 groups, sharded 8
    ways. XLA's SPMD partitioner builds a convolution its own verifier rejects ("Expected
    output feature dimension (value 2) to be divisible by feature_group_count (value 4)").
    torchspmd lowers grouped convolutions as einsums instead (lowering/conv.py
    ``_grouped_conv``). When this test fails, XLA is fixed: that form can go."""
    done = subprocess.run([sys.executable, "-c", GROUPED], capture_output=True, text=True,
                          timeout=300)
    assert "raised:" in done.stdout and "divisible by feature_group_count" in done.stdout, \
        done.stdout + done.stderr
