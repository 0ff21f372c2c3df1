"""call_jax: JAX functions as graph nodes, with gradients, shardings and manual regions."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P

import torchspmd
from torchspmd import Mesh, call_jax, mark_sharding

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, os.path.abspath(EXAMPLES))

import call_jax_attention  # noqa: E402  (found through the path insert above)


def spmd(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    return t.to("spmd").requires_grad_(requires_grad)


def test_gpt_block_with_jax_attention_matches_the_sdpa_block_on_cpu():
    diffs = call_jax_attention.compare(dim=32, heads=4, batch=8, seq=8)
    assert diffs["output"] < 1e-5
    assert max(v for k, v in diffs.items() if k != "output") < 1e-6


def test_output_and_gradient_match_cpu():
    x = torch.randn(4, 8)
    xs = spmd(x, requires_grad=True)
    out = call_jax(lambda a, scale: jnp.sin(a) * scale, xs, 2.0)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), torch.sin(x) * 2)
    torch.testing.assert_close(xs.grad.cpu(), torch.cos(x) * 2)


@pytest.mark.parametrize("alias", ["itself", "detached", "a view", "an expanded row"])
def test_one_tensor_given_as_several_arguments_gets_every_gradient(alias):
    """``f(x, x)``: the arguments are one value in the program; the gradient is the sum of
    both uses, as on CPU (the forward's saved values once depended on that and failed)."""
    make = {"itself": lambda t: t, "detached": lambda t: t.detach(),
            "a view": lambda t: t.view(4, 8), "an expanded row": lambda t: t[0].expand(4, 8)}
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    d = spmd(x.detach(), requires_grad=True)
    out = call_jax(lambda a, b, c: a * jnp.sin(b) + jnp.cos(c) * a, d, make[alias](d), d)
    out.sum().backward()
    expected = x * torch.sin(make[alias](x)) + torch.cos(x) * x
    expected.sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_pytree_outputs_keep_their_structure_and_dtypes():
    x = torch.randn(3, 5)
    out = call_jax(lambda a: {"max": a.max(axis=1), "argmax": jnp.argmax(a, axis=1)}, spmd(x))
    torch.testing.assert_close(out["max"].cpu(), x.max(dim=1).values)
    assert out["argmax"].dtype == torch.int64
    assert out["argmax"].cpu().tolist() == x.argmax(dim=1).tolist()


def test_integer_outputs_do_not_block_the_gradient_of_float_outputs():
    x = torch.randn(6)
    xs = spmd(x, requires_grad=True)
    values, index = call_jax(lambda a: (a * a, jnp.argsort(a)), xs)
    assert not index.requires_grad
    values.sum().backward()
    torch.testing.assert_close(xs.grad.cpu(), 2 * x)


def test_only_floating_inputs_get_gradients():
    x, idx = torch.randn(5, 3), torch.tensor([4, 0, 2])
    xs = spmd(x, requires_grad=True)
    out = call_jax(lambda a, i: a[i], xs, spmd(idx))
    out.sum().backward()
    expected = torch.zeros(5, 3)
    expected[[4, 0, 2]] = 1
    torch.testing.assert_close(xs.grad.cpu(), expected)


def test_second_derivative_goes_through_the_vjp_node():
    x = torch.randn(4)
    xs = spmd(x, requires_grad=True)
    (grad,) = torch.autograd.grad(call_jax(jnp.sin, xs).sum(), xs, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), xs)
    torch.testing.assert_close(second.cpu(), -torch.sin(x))


def test_sharding_constraint_inside_the_function_reaches_the_output():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    jax_mesh = mesh.get_jax_mesh()
    sharding = jax.sharding.NamedSharding(jax_mesh, P("model", "data"))
    x = torch.randn(8, 8)
    out = call_jax(lambda a: jax.lax.with_sharding_constraint(a * 3, sharding), spmd(x))
    torchspmd.sync()
    array = out.handle.value()[0].arrays[0]
    assert array.sharding.is_equivalent_to(sharding, 2)
    torch.testing.assert_close(out.cpu(), x * 3)


def test_shard_map_kernel_over_the_mesh_matches_cpu():
    mesh = Mesh(np.arange(8), (8,), ("data",))

    def row_softmax(a):  # each device normalizes its own rows: no communication
        return jax.shard_map(lambda b: jax.nn.softmax(b, axis=-1), mesh=mesh.get_jax_mesh(),
                             in_specs=P("data"), out_specs=P("data"))(a)

    x = torch.randn(16, 8)
    xs = spmd(x, requires_grad=True)
    mark_sharding(xs, mesh, ("data", None))
    out = call_jax(row_softmax, xs)
    (out * torch.arange(8.0).to("spmd")).sum().backward()
    xc = x.clone().requires_grad_()
    expected = torch.softmax(xc, dim=-1)
    (expected * torch.arange(8.0)).sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    torch.testing.assert_close(xs.grad.cpu(), xc.grad)


def test_inside_a_manual_sharding_region_the_function_sees_local_blocks():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    x = torch.randn(16, 4)
    xs = spmd(x)
    mark_sharding(xs, mesh, ("data", None))
    local = torchspmd.enable_manual_sharding(xs, ("data", None), mesh=mesh).global_tensor
    assert local.shape == (2, 4)
    # The sum over axis 0 of each local block: a per-device result, as in PyTorch/XLA.
    summed = call_jax(lambda b: jnp.broadcast_to(b.sum(axis=0), b.shape), local)
    out = torchspmd.disable_manual_sharding(summed, ("data", None), (16, 4), mesh=mesh)
    expected = x.view(8, 2, 4).sum(dim=1, keepdim=True).expand(8, 2, 4).reshape(16, 4)
    torch.testing.assert_close(out.global_tensor.cpu(), expected)


def test_the_same_call_each_step_compiles_once():
    x = torch.randn(4)
    call_jax(jnp.tanh, spmd(x)).cpu()
    before = torchspmd.metrics()["graphs_compiled"]
    for _ in range(3):
        torch.testing.assert_close(call_jax(jnp.tanh, spmd(x)).cpu(), torch.tanh(x))
    assert torchspmd.metrics()["graphs_compiled"] == before


def test_a_cpu_tensor_argument_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"argument 0 is a tensor on cpu.*to\('spmd'\)"):
        call_jax(jnp.sin, torch.randn(3))


def test_an_unhashable_static_argument_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="must be hashable.*Pass arrays as tensors"):
        call_jax(lambda a, scale: a * scale, spmd(torch.randn(3)), np.ones(3))


def test_non_array_outputs_are_refused():
    with pytest.raises(TypeError, match="outputs must be JAX arrays"):
        call_jax(lambda a: (a, "label"), spmd(torch.randn(3)))


def test_a_function_returning_nothing_is_refused():
    with pytest.raises(ValueError, match="returned no arrays"):
        call_jax(lambda a: None, spmd(torch.randn(3)))
