"""debug.program_size / compare_programs: a compiled step's program next to another's."""

import jax
import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.debug import collectives, compare_programs, program_size
from torchspmd.sharding import Mesh, mark_sharding

from tests.step.helpers import train_step

# The fused computation's copy and dot are inside one kernel: only the entry's count.
SYNTHETIC = """
HloModule m, entry_computation_layout={(f32[4,4]{1,0}, f32[4]{0})->(f32[4,4]{1,0}, f32[4]{0}, (f32[], f32[]))}

%fused_computation (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %c = f32[4,4]{1,0} copy(%a)
  ROOT %d = f32[4,4]{1,0} dot(%c, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.7 (p0: f32[4,4], p1: f32[4]) -> (f32[4,4], f32[4], (f32[], f32[])) {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %cp = f32[4,4]{1,0} copy(%p0)
  %dot = f32[4,4]{1,0} dot(%cp, %p0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %f = f32[4,4]{1,0} fusion(%dot, %p0), kind=kOutput, calls=%fused_computation
  %ar = f32[4]{0} all-reduce(%p1), to_apply=%add
  %s = f32[] constant(0)
  %pair = (f32[], f32[]) tuple(%s, %s)
  ROOT %out = (f32[4,4]{1,0}, f32[4]{0}, (f32[], f32[])) tuple(%f, %ar, %pair)
}
"""


def test_program_size_counts_the_entry_and_leaves_fused_computations_out():
    size = program_size(SYNTHETIC)
    assert (size.parameters, size.outputs, size.fusions, size.copies, size.dots) == (2, 3, 1, 1, 1)
    assert size.instructions == 9
    assert size.collectives["all-reduce"] == 1


def _jax_sgd(w, b, x, y):
    def loss(w, b):
        return jax.numpy.mean((x @ w.T + b - y) ** 2)

    gw, gb = jax.grad(loss, argnums=(0, 1))(w, b)
    return w - 0.1 * gw, b - 0.1 * gb, loss(w, b)


def test_compare_programs_puts_a_compiled_step_next_to_a_jax_function():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(torchspmd.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torchspmd.compile(train_step(model, opt))
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    step(x.to(torchspmd.device()), y.to(torchspmd.device()))
    args = [np.float32(a) for a in (np.zeros((4, 8)), np.zeros(4), x.numpy(), y.numpy())]
    comparison = compare_programs(step, _jax_sgd, *args, name="JAX")
    assert comparison.ours == program_size(step.optimized_hlo())
    assert comparison.theirs == program_size(jax.jit(_jax_sgd).lower(*args).compile().as_text())
    assert comparison.theirs.parameters == 4 and comparison.theirs.outputs == 3
    table = str(comparison)
    assert "torchspmd" in table.splitlines()[0] and "JAX" in table.splitlines()[0]
    assert [row[0] for row in comparison.rows()][:2] == ["parameters", "outputs"]


def test_compare_programs_shows_the_collectives_of_both_programs():
    mesh = Mesh(np.arange(8), (8,), ("x",))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 16).to(torchspmd.device())
    mark_sharding(model.weight, mesh, ("x", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torchspmd.compile(train_step(model, opt))
    x, y = torch.randn(16, 8).to(torchspmd.device()), torch.randn(16, 16).to(torchspmd.device())
    step(x, y)
    hlo = step.optimized_hlo()
    comparison = compare_programs(step, hlo)
    assert comparison.ours == comparison.theirs
    assert comparison.ours.collectives == collectives(hlo)
    assert sum(comparison.ours.collectives.values()) > 0


def test_compare_programs_before_the_step_ran_says_so():
    model = torch.nn.Linear(2, 2).to(torchspmd.device())
    step = torchspmd.compile(train_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    with pytest.raises(RuntimeError, match="has not run yet"):
        compare_programs(step, SYNTHETIC)
    with pytest.raises(TypeError, match="cannot read a program"):
        compare_programs(SYNTHETIC, 3)


def test_program_size_of_a_step_that_has_not_run_says_what_to_do():
    with pytest.raises(TypeError, match="call the step twice"):
        program_size(None)
