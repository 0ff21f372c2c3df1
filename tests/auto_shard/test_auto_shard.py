"""torchspmd.auto_shard: deterministic plans, training equal to CPU, the memory budget,
JSON, and the error when nothing fits. Tiny models on a 1-D mesh of 8 CPU devices, so
that each plan compiles a handful of layer programs."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchspmd
from torchspmd.auto_shard import AutoShardPlan, NoPlanFits, auto_shard
from torchspmd.sharding import Mesh, get_sharding

STEPS = 2


class Block(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class Stack(nn.Module):
    """Two alike blocks: one role (``blocks.*.up+down``) for both."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def mse(model, x, y):
    return F.mse_loss(model(x), y)


def mesh() -> Mesh:
    return Mesh(np.arange(8), (8,), ("model",))


def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g))
            for _ in range(STEPS)]


def model() -> Stack:
    torch.manual_seed(0)
    return Stack()


def plan_for(budget=None, measure: bool = True) -> AutoShardPlan:
    return auto_shard(model(), mesh(), data()[0], loss_fn=mse, memory_budget=budget,
                      measure=measure)


@pytest.fixture(scope="module")
def free_plan() -> AutoShardPlan:
    """No budget; the finalists run (the default)."""
    return plan_for()


@pytest.fixture(scope="module")
def predicted_plan() -> AutoShardPlan:
    """No budget, chosen by prediction alone (``measure=False``)."""
    return plan_for(measure=False)


@pytest.fixture(scope="module")
def tight():
    """A plan under a budget below the replicated plan's memory, and a training run of it
    with torchspmd.compile next to CPU eager."""
    replicated = plan_for(budget=None)
    budget = 0.75 * _replicated_memory(replicated)
    plan = plan_for(budget)
    spmd = plan.apply(copy.deepcopy(model()).to("spmd"))
    cpu = model()
    opt_s = torch.optim.AdamW(spmd.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)

    @torchspmd.compile
    def step(x, y):
        opt_s.zero_grad()
        loss = mse(spmd, x, y)
        loss.backward()
        opt_s.step()
        return loss

    losses = []
    for x, y in data():
        xs, ys = plan.shard_batch(x.to("spmd"), y.to("spmd"))
        opt_c.zero_grad()
        loss_c = mse(cpu, x, y)
        loss_c.backward()
        opt_c.step()
        losses.append((step(xs, ys).item(), loss_c.item()))
    return dict(plan=plan, budget=budget, spmd=spmd, cpu=cpu, losses=losses,
                memory=step.memory_analysis())


def _replicated_memory(plan: AutoShardPlan) -> float:
    """Predicted memory of the all-replicated plan: the best or runner-up of a free plan
    on this model is replicated (nothing to save), else plan it."""
    for summary in (plan.best, plan.runner_up):
        if summary is not None and set(summary.choices.values()) == {"replicate"}:
            return summary.memory_bytes
    raise AssertionError(f"no replicated plan among {plan.best}, {plan.runner_up}")


def test_plans_are_deterministic(predicted_plan):
    """Chosen by prediction, the same model, inputs and mesh give the same plan, to the
    byte of its JSON. (Measured plans carry this run's times, and between two plans
    that measure alike the choice may differ: save one with to_json to reuse it.)"""
    assert plan_for(measure=False).to_json() == predicted_plan.to_json()


def test_plan_round_trips_through_json(tight):
    """from_json(to_json()) is the same plan, and it marks the same shardings."""
    plan = tight["plan"]
    again = AutoShardPlan.from_json(plan.to_json())
    assert again == plan
    applied = again.apply(copy.deepcopy(model()).to("spmd"))
    for (name, p), q in zip(applied.named_parameters(), tight["spmd"].parameters()):
        assert get_sharding(p) == get_sharding(q), name


def test_tight_budget_shards_parameters(tight):
    """Under a budget below replication, some weight is split (the plan is not trivial)."""
    specs = tight["plan"].specs
    assert any(any(e is not None for e in spec) for spec in specs.values()), specs


def test_memory_budget_is_respected(tight):
    """The compiled step of the chosen plan needs no more than the budget per device, by
    XLA's memory analysis (arguments + outputs - aliased + temporaries)."""
    m = tight["memory"]
    used = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)
    assert tight["plan"].predicted_memory_bytes <= tight["budget"]
    assert used <= tight["budget"], (used, tight["budget"])


def test_plan_trains_like_cpu(tight):
    """Two AdamW steps under the plan give CPU's losses and CPU's parameters, element by
    element."""
    for spmd, cpu in tight["losses"]:
        assert spmd == pytest.approx(cpu, rel=1e-5, abs=1e-6)
    for (name, p), q in zip(tight["spmd"].named_parameters(), tight["cpu"].parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6,
                                   msg=name)


def test_no_plan_fits_names_the_smallest_memory():
    """A budget nothing fits raises NoPlanFits stating the least memory any plan needs,
    and that amount is a budget some plan fits."""
    with pytest.raises(NoPlanFits, match="smallest any candidate plan needs") as info:
        plan_for(budget=1.0)
    smallest = float(re.search(r"needs is (\d+) bytes", str(info.value)).group(1))
    assert plan_for(budget=smallest + 1).predicted_memory_bytes <= smallest + 1


def test_a_plan_for_another_model_is_refused(free_plan):
    """Applying a plan to a model whose parameters it does not know raises, naming them,
    instead of leaving them replicated without a word."""
    other = model()
    other.blocks.append(Block())
    with pytest.raises(ValueError, match=r"no spec for 'blocks\.2\.down\.bias'"):
        free_plan.apply(other.to("spmd"))
    fewer = model()
    del fewer.blocks[1]
    with pytest.raises(ValueError, match=r"model has no parameter 'blocks\.1\.down\.bias'"):
        free_plan.apply(fewer.to("spmd"))


def test_print_shows_specs_time_memory_and_runner_up(free_plan):
    """str(plan) has a row per role with its spec, the predicted step and memory, the
    collectives and the runner-up."""
    text = str(free_plan)
    assert "blocks.*.up.weight" in text
    for what in ("predicted step:", "memory/device:", "collectives/step:", "runner-up:",
                 "plans compared", "<- chosen"):
        assert what in text


def test_the_plans_compared_are_listed_fastest_first(predicted_plan):
    """Without measuring, every plan priced as a whole step is in the plan, the chosen one
    first, those that fit the budget before those that do not, each group fastest
    predicted first, and none was run."""
    priced = predicted_plan.priced
    assert priced[0].step_s == predicted_plan.best.step_s
    assert any("integer program 1" in p.name for p in priced)
    assert [p.fits for p in priced] == sorted((p.fits for p in priced), reverse=True)
    fitting = [p.step_s for p in priced if p.fits]
    assert fitting == sorted(fitting)
    assert all(p.measured_s is None for p in priced)
    assert predicted_plan.measured_step_ms is None
    assert "fastest predicted chosen" in str(predicted_plan)


def test_the_finalists_run_and_the_fastest_measured_is_chosen(free_plan):
    """Measuring, the plans predicted within FINALISTS_WITHIN of the fastest are run (the
    FINALISTS fastest predicted of them); they come first, the chosen one the fastest
    measured (of those within MEASURED_TIE of it, the one needing least memory), then
    the others fastest measured first."""
    from torchspmd.auto_shard.api import FINALISTS, FINALISTS_WITHIN, MEASURED_TIE
    priced = free_plan.priced
    fastest = min(p.step_s for p in priced if p.fits)
    ran = [p for p in priced if p.measured_s is not None]
    close = sorted((p for p in priced if p.fits and p.step_s <= FINALISTS_WITHIN * fastest),
                   key=lambda p: p.step_s)
    assert {p.name for p in ran} == {p.name for p in close[:FINALISTS]}
    assert len(ran) >= 2
    assert priced[:len(ran)] == ran
    chosen, others = ran[0], ran[1:]
    assert [p.measured_s for p in others] == sorted(p.measured_s for p in others)
    quickest = min(p.measured_s for p in ran)
    tied = [p for p in ran if p.measured_s <= (1 + MEASURED_TIE) * quickest]
    assert chosen.memory_bytes == min(p.memory_bytes for p in tied)  # a tie: least memory
    assert free_plan.measured_step_ms == pytest.approx(chosen.measured_s * 1e3)
    assert "(measured " in str(free_plan) and "fastest measured chosen" in str(free_plan)


def test_measuring_leaves_the_model_as_it_was():
    """The finalists run on zero-filled inputs of their own: the model's parameters and
    gradients are untouched."""
    planned, reference = model(), model()
    auto_shard(planned, mesh(), data()[0], loss_fn=mse)
    for (name, p), q in zip(planned.named_parameters(), reference.parameters()):
        assert p.device.type == "cpu" and p.grad is None, name
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=0, msg=name)


def test_a_model_and_batch_already_on_the_device_keep_their_values_and_layouts():
    """Planning a model and inputs that are already spmd tensors, marked, compiles the
    planner's own copies: the caller's tensors keep their values and annotations."""
    cpu = model()
    spmd = copy.deepcopy(cpu).to("spmd")
    torchspmd.mark_sharding(spmd.blocks[0].up.weight, mesh(), ("model", None))
    x, y = data()[0]
    xd, yd = x.to("spmd"), y.to("spmd")
    torchspmd.mark_sharding(yd, mesh(), (None, "model"))
    before = [get_sharding(t) for t in (*spmd.parameters(), xd, yd)]
    plan = auto_shard(spmd, mesh(), (xd, yd), loss_fn=mse, measure=False)
    assert set(plan.specs) == {name for name, _ in cpu.named_parameters()}
    assert [get_sharding(t) for t in (*spmd.parameters(), xd, yd)] == before
    torch.testing.assert_close(xd.cpu(), x, rtol=0, atol=0)
    torch.testing.assert_close(yd.cpu(), y, rtol=0, atol=0)
    for (name, p), q in zip(spmd.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("budget, error, match", [
    ("1GB", TypeError, "memory_budget must be a number of bytes"),
    (True, TypeError, "memory_budget must be a number of bytes"),
    (0, ValueError, "memory_budget must be a positive number"),
    (float("nan"), ValueError, "memory_budget must be a positive number"),
])
def test_a_budget_that_is_no_number_of_bytes_is_refused_before_compiling(budget, error, match):
    with pytest.raises(error, match=match):
        auto_shard(model(), mesh(), data()[0], loss_fn=mse, memory_budget=budget)


def test_example_inputs_must_be_positional():
    """A dict (keyword inputs) is refused by name, not read as its keys."""
    x, y = data()[0]
    with pytest.raises(TypeError, match="example_inputs must be a tensor or a tuple.*got dict"):
        auto_shard(model(), mesh(), {"x": x, "y": y}, loss_fn=mse)


def test_a_model_without_trainable_parameters_is_refused():
    frozen = model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        auto_shard(frozen, mesh(), data()[0], loss_fn=mse)


@pytest.mark.parametrize("text", ["{}", "not json", "[1, 2]", '{"mesh_devices": [0]}'])
def test_text_that_is_no_saved_plan_is_refused(text):
    with pytest.raises(ValueError, match=r"from_json: the text is not a plan saved by "
                                         r"plan.to_json\(\)"):
        AutoShardPlan.from_json(text)
