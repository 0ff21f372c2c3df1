"""Meshes that list the devices in a permuted order (issue 20 §2).

XLA may give an output a layout that JAX cannot re-express over the input's mesh when that
mesh is permuted; JAX then raised ``IndivisibleError`` out of ``sync()``. Every output must
come back readable, equal to CPU, and usable in the next step.
"""

import numpy as np
import pytest
import torch

import torchspmd as xs

CASES = [
    # (device ids, mesh shape, axis names, spec of x)
    ([3, 6, 0, 5, 1, 7, 2, 4], (4, 2), ("a", "b"), ("b", "a")),
    ([5, 2, 7, 0, 6, 1, 4, 3], (2, 4), ("a", "b"), ("a", "b")),
    ([6, 1, 3, 4, 0, 7, 5, 2], (2, 2, 2), ("a", "b", "c"), (("c", "a"), "b")),
    ([6, 1, 3, 4, 0, 7, 5, 2], (2, 2, 2), ("a", "b", "c"), ("c", None, ("a", "b"))),
]


@pytest.mark.parametrize("ids,shape,names,spec", CASES)
def test_a_step_on_a_permuted_mesh_matches_cpu_and_its_result_is_usable(ids, shape, names, spec):
    torch.manual_seed(0)
    rank = len(spec)
    x_cpu = torch.randn(16, 12) if rank == 2 else torch.randn(4, 16, 12)
    w_cpu = torch.randn(12, 8)
    mesh = xs.Mesh(ids, shape, names)
    x, w = x_cpu.to(xs.device()), w_cpu.to(xs.device())
    xs.mark_sharding(x, mesh, spec)
    y = torch.tanh(x @ w).cumsum(0)
    xs.sync()
    expected = torch.tanh(x_cpu @ w_cpu).cumsum(0)
    torch.testing.assert_close(y.cpu(), expected)
    z = (y * 2 + x.sum(-1, keepdim=True)).exp().mean(0)  # the next step reads y's data
    torch.testing.assert_close(z.cpu(), (expected * 2 + x_cpu.sum(-1, keepdim=True)).exp().mean(0))


def test_a_compiled_step_on_a_permuted_mesh_matches_cpu():
    ids, shape, names, spec = CASES[0]
    mesh = xs.Mesh(ids, shape, names)
    w_cpu = torch.randn(12, 8)
    w = w_cpu.to(xs.device())

    @xs.compile
    def step(x):
        xs.mark_sharding(x, mesh, spec)
        return torch.tanh(x @ w).cumsum(0)

    for _ in range(3):
        x_cpu = torch.randn(16, 12)
        torch.testing.assert_close(step(x_cpu.to(xs.device())).cpu(),
                                   torch.tanh(x_cpu @ w_cpu).cumsum(0))


def test_plain_jax_still_cannot_express_the_output_layout_over_a_permuted_mesh():
    """The JAX bug routed around in ``Program.run`` (``unrepresentable_output``): when this
    test fails, JAX is fixed; drop the workaround and this test."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from torchspmd.runtime.transfer import replicated

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    sharding = NamedSharding(mesh, PartitionSpec("b", "a"),
                             _logical_device_ids=(3, 6, 0, 5, 1, 7, 2, 4))
    x = jax.device_put(np.ones((16, 12), np.float32), sharding)
    w = jax.device_put(np.ones((12, 8), np.float32), replicated())  # mesh-free replicated
    f = jax.jit(lambda x, w: jnp.cumsum(jnp.tanh(x @ w), 0))
    with pytest.raises(Exception) as info:
        f(x, w)
    assert type(info.value).__name__ == "IndivisibleError"
