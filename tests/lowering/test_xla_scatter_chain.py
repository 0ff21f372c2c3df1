"""XLA's SPMD partitioner miscompiles two chained scatters into a replicated operand whose
result is sharded: with 2 or 4 shards, some shards of the second scatter read the first
one's input. Plain JAX reproduces it (found by the fuzzer, seed 0 program 627), so the
indexing lowerings (index_put, put, scatter, scatter_reduce/index_reduce) put each
scatter's operand behind an optimization barrier (``lowering/indexing.py: _scatter_into``). When this test fails, XLA is fixed: drop the
barrier."""

import subprocess
import sys
import textwrap

REPRO = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    def f(x, i1, i2, z):
        y = x.at[i1].set(3).at[i2].set(z[0])
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("data")))
    args = (np.array([3, -4, -1, -3, -3, -3, -4, -3], np.int32), np.array([0, 7]), np.array([6]),
            np.array([0], np.int32))
    want = np.array([3, -4, -1, -3, -3, -3, 0, 3])
    got = jax.jit(f)(*[jax.device_put(a, NamedSharding(mesh, P())) for a in args])
    print("same" if (np.asarray(got) == want).all() else f"wrong {np.asarray(got)}")
""")


def test_xla_still_miscompiles_two_chained_scatters_into_a_sharded_result():
    done = subprocess.run([sys.executable, "-c", REPRO], capture_output=True, text=True, timeout=300)
    assert "wrong" in done.stdout, done.stdout + done.stderr
