"""XLA's SPMD partitioner builds an invalid program for a sharding constraint on a slice
of size 1 taken at the start of a dimension split in shards of size 1 (the verifier:
"Expected instruction to have shape equal to f32[4,2], actual shape is f32[4,1]"). Plain
JAX reproduces it (found by the fuzzer, seed 39 program 237: `mark_sharding` of
`t0.narrow(1, 0, 1)` while `t0` is annotated 2 ways on its 2 columns), so the
annotation lowering puts a value with a dimension of size 1 behind an optimization
barrier before constraining it (``lowering/annotation_ops.py: sharding_constraint``).
When the first test fails, XLA is fixed: drop the barrier."""

import subprocess
import sys
import textwrap

import numpy as np
import torch

import torchspmd as xs

REPRO = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    def f(x):
        base = x.reshape(4, 2)
        first = jax.lax.with_sharding_constraint(base[:, 0:1], NamedSharding(mesh, P()))
        return jax.lax.with_sharding_constraint(base, NamedSharding(mesh, P(None, "a"))), first
    try:
        jax.jit(f)(jnp.arange(8.0))
        print("compiles")
    except Exception as error:
        print("invalid", str(error)[:200])
""")


def test_xla_still_rejects_a_constrained_size_one_slice_of_size_one_shards():
    done = subprocess.run([sys.executable, "-c", REPRO], capture_output=True, text=True, timeout=300)
    assert "invalid" in done.stdout and "Expected instruction to have shape" in done.stdout, \
        done.stdout + done.stderr


def _annotated_narrow_written_in_place(device, mesh=None):
    t0 = (torch.arange(8, dtype=torch.float32, device=device) - 4).reshape(4, 2)
    t2 = t0.narrow(1, 0, 1)
    if mesh is not None:
        xs.mark_sharding(t2, mesh, (None, None))
    t3 = t2[:, 0::3]
    if mesh is not None:
        xs.annotate_custom_sharding(t0, mesh, (None, 0))
    t3.masked_fill_(t3 > 0, -3)
    return [t.cpu() for t in (t0, t2, t3, t3 * t2)]


def test_an_annotated_narrow_of_a_column_sharded_tensor_matches_cpu():
    mesh = xs.Mesh(np.array([6, 5, 3, 4, 0, 7, 2, 1]), (2, 2, 2))
    for got, want in zip(_annotated_narrow_written_in_place(xs.device(), mesh),
                         _annotated_narrow_written_in_place("cpu")):
        torch.testing.assert_close(got, want)
