"""Meshes that list the devices in a permuted order (issue 20 §2).

XLA may give an output a layout that JAX cannot re-express over the input's mesh when that
mesh is permuted; JAX then raised ``IndivisibleError`` out of ``sync()``. Every output must
come back readable, equal to CPU, and usable in the next step.
"""

import copy

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


# XLA miscompiles tiles laid over a permutation of the program's devices (plain-JAX repro:
# tests/lowering/test_xla_permuted_tiles.py): the weight gradient of ``x @ w.t()`` came
# back wrong when x was marked on a permuted mesh.
GRADIENT_CASES = [
    # (device ids, mesh shape, axis names, spec of x (16, 8))
    ([1, 0, 3, 5, 6, 4, 7, 2], (2, 2, 2), ("data", "model", "x"), (("model", "data"), "x")),
    ([3, 6, 0, 5, 1, 7, 2, 4], (2, 2, 2), ("data", "model", "x"), ("x", ("data", "model"))),
    ([3, 6, 0, 5, 1, 7, 2, 4], (2, 2, 2), ("data", "model", "x"), (("x", "data"), None)),
    ([1, 0, 3, 5, 6, 4, 7, 2], (4, 2), ("a", "b"), ("a", "b")),
    ([3, 6, 0, 5, 1, 7, 2, 4], (4, 2), ("a", "b"), ("a", "b")),
    ([3, 6, 0, 5, 1, 7, 2, 4], (2, 4), ("a", "b"), (None, ("b", "a"))),
]


def _gradients(x, w, mesh=None, spec=None):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    if mesh is not None:
        xs.mark_sharding(x, mesh, spec)
    y = x @ w.t()
    (y * y).sum().backward()
    return y.detach(), x.grad, w.grad


def _integers(*shape):
    """Small integers: every product and sum is exact, so results must match bit for bit."""
    return torch.randint(-4, 5, shape, generator=torch.Generator().manual_seed(0)).float()


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
@pytest.mark.parametrize("ids,shape,names,spec", GRADIENT_CASES)
def test_forward_and_gradients_on_a_permuted_mesh_equal_cpu(ids, shape, names, spec, compiled):
    x_cpu, w_cpu = _integers(16, 8), _integers(4, 8)
    mesh = xs.Mesh(ids, shape, names)
    step = xs.compile(_gradients) if compiled else _gradients
    got = step(x_cpu.to(xs.device()), w_cpu.to(xs.device()), mesh, spec)
    for value, expected in zip(got, _gradients(x_cpu, w_cpu)):
        torch.testing.assert_close(value.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
def test_three_training_steps_on_a_permuted_mesh_equal_cpu(compiled):
    """The fuzzer's program (seed 2, program 20): wrong parameters after one step."""
    mesh = xs.Mesh([1, 0, 3, 5, 6, 4, 7, 2], (2, 2, 2), ("data", "model", "x"))
    torch.manual_seed(636)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 8))
    model = copy.deepcopy(cpu_model).to(xs.device())
    xs.mark_sharding(model.get_parameter("2.weight"), mesh, (None, None))
    x_cpu, y_cpu = torch.randn(16, 8), torch.randn(16, 8)
    x, y = x_cpu.to(xs.device()), y_cpu.to(xs.device())
    xs.mark_sharding(x, mesh, (("model", "data"), "x"))

    def trainer(net):
        opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x / 4), y / 4)
            loss.backward()
            opt.step()
            return loss
        return step

    cpu_step, step = trainer(cpu_model), trainer(model)
    step = xs.compile(step) if compiled else step
    for _ in range(3):
        torch.testing.assert_close(step(x, y).cpu(), cpu_step(x_cpu, y_cpu))
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=name)
