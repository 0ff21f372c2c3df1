"""XLA computes a dot into a layout that splits a dim over mesh axes out of mesh order
wrongly: plain JAX, a (2, 2, 2) mesh ``("a", "b", "c")`` in id order, ``W + g.T @ x``
with ``W`` laid out ``P(("c", "a"), "b")`` (dim 0 tiled minor axis first), ``x``
``P("b", "a")`` and ``g`` replicated, gives four devices their neighbours' blocks
(Shardy and GSPMD alike, JAX 0.10.2). ``P(("a", "c"), "b")``, the same tiling with the
blocks on other devices, is right. The differential fuzzer found it as a Linear's weight
update (seed 17, program 21).

torchspmd routes around it in ``lowering/xla_shardings.in_id_order``: XLA is given each
dim's axes in mesh order (``axes_in_mesh_order``); the annotation keeps the user's order.
When ``test_xla_still_miscompiles_a_dot_into_axes_out_of_mesh_order`` fails, XLA is fixed.
"""

import copy

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import torchspmd
from torchspmd.lowering.xla_shardings import axes_in_mesh_order


def _update(w_spec):
    rng = np.random.default_rng(0)
    w, x, g = (rng.standard_normal(s, dtype=np.float32) for s in ((16, 8), (16, 8), (16, 16)))
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("a", "b", "c"))
    args = [jax.device_put(v, NamedSharding(mesh, s)) for v, s in
            ((w, w_spec), (x, P("b", "a")), (g, P()))]
    got = jax.jit(lambda w, x, g: w + g.T @ x)(*args)
    return np.abs(np.asarray(got) - (w + g.T @ x)).max()


def test_xla_still_miscompiles_a_dot_into_axes_out_of_mesh_order():
    """Drop ``axes_in_mesh_order`` from ``in_id_order`` when this fails."""
    assert _update(P(("c", "a"), "b")) > 1.0


def test_the_same_tiling_with_axes_in_mesh_order_is_right():
    assert _update(P(("a", "c"), "b")) < 1e-4
    assert axes_in_mesh_order(P(("c", "a"), "b"), ("a", "b", "c")) == P(("a", "c"), "b")


def test_a_linear_trained_with_its_weight_split_minor_axis_first_matches_cpu():
    mesh = torchspmd.Mesh(list(range(8)), (2, 2, 2))
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    model = copy.deepcopy(cpu).to("spmd")
    torchspmd.mark_sharding(model[0].weight, mesh, ((2, 0), 1))
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    xd = x.to("spmd")
    torchspmd.mark_sharding(xd, mesh, (1, 0))
    for m, inputs, targets in ((cpu, x, y), (model, xd, y.to("spmd"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):  # forward, backward and update in one graph per step
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(inputs / 4), targets / 4).backward()
            opt.step()
    for p_cpu, p in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu)
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad)
    assert torchspmd.get_sharding(model[0].weight) == "{devices=[4,2]0,2,4,6,1,3,5,7}"
