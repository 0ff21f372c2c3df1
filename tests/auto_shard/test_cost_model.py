"""The machine model: a plan's step predicted from XLA's numbers for its whole program,
constants fitted to measured steps, and the planner choosing among its own proposals and
the hand-written plans by that prediction."""

from __future__ import annotations

import math

import numpy as np
import torch
import pytest

from torchspmd.auto_shard import Machine, Planner, calibrate, fit
from torchspmd.auto_shard.api import HAND_WRITTEN
from torchspmd.auto_shard.collectives import Collective
from torchspmd.auto_shard.pricing import Priced, shard_bytes, step_seconds
from torchspmd.auto_shard.whole_step import WholeStep

from tests.auto_shard.test_auto_shard import data, mesh, model, mse

MACHINE = Machine("made up", flops_per_s=2e10, bytes_per_s=5e9, latency_s=20e-6,
                  link_bytes_per_s=8e9, step_overhead_s=3e-3, rendezvous_s=25e-6)


def _priced(flops, nbytes, update, collectives) -> Priced:
    whole = WholeStep(flops, nbytes, tuple(collectives), memory_bytes=0)
    return Priced(0.0, 0.0, {}, whole, update)


def test_a_collective_costs_latency_rendezvous_per_device_and_bytes_sent():
    """An all-reduce over 8 devices: latency + 8 rendezvous + its ring traffic."""
    reduce = Collective("all-reduce", result_bytes=4096, group=8)
    expected = 20e-6 + 8 * 25e-6 + 2 * 7 / 8 * 4096 / 8e9
    assert MACHINE.time(0.0, 0.0, [reduce]) == pytest.approx(expected)
    assert MACHINE.time(4e10, 5e9, []) == pytest.approx(2.0 + 1.0)


def test_fit_recovers_the_machine_that_made_the_steps():
    """Steps timed as a known machine would run them give that machine back."""
    rng = np.random.default_rng(0)
    measured = []
    for _ in range(12):
        collectives = [Collective("all-reduce", int(rng.integers(1, 1 << 20)),
                                  int(rng.choice([2, 4, 8])))
                       for _ in range(int(rng.integers(0, 30)))]
        priced = _priced(float(rng.uniform(1e7, 1e9)), float(rng.uniform(1e6, 1e8)),
                         float(rng.uniform(0, 3e7)), collectives)
        measured.append((priced, step_seconds(MACHINE, priced.whole, priced.update_bytes)))
    fitted = fit(measured, link_bytes_per_s=MACHINE.link_bytes_per_s)
    for field in ("flops_per_s", "bytes_per_s", "step_overhead_s", "rendezvous_s"):
        assert getattr(fitted, field) == pytest.approx(getattr(MACHINE, field), rel=1e-4), field
    assert fitted.latency_s == pytest.approx(MACHINE.latency_s, abs=1e-8)


def test_fit_refuses_too_few_steps():
    """Five constants from four steps would be a guess: a clear error instead."""
    with pytest.raises(ValueError, match="at least 5 plans"):
        fit([(_priced(1e8, 1e6, 0.0, []), 0.01)] * 4)


def test_calibrate_measures_positive_finite_rates():
    """The microbenchmarks run on the CPU devices and give usable constants."""
    machine = calibrate()
    for value in (machine.flops_per_s, machine.bytes_per_s, machine.link_bytes_per_s):
        assert 0 < value < math.inf
    assert machine.latency_s > 0


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner(model(), mesh(), data()[0], loss_fn=mse)


def test_the_chosen_plan_is_predicted_no_slower_than_any_hand_written_one(planner):
    """The hand-written plans are priced with the planner's own proposals, so the plan
    it chooses by prediction is never predicted slower than one a user would write (by
    measurement: ``test_the_finalists_run_and_the_fastest_measured_is_chosen``)."""
    chosen = planner.plan(measure=False)
    for strategy in HAND_WRITTEN:
        try:
            hand = planner.plan(strategy=strategy)
        except ValueError:  # fsdp+tp on a 1-D mesh
            continue
        assert chosen.predicted_step_ms <= hand.predicted_step_ms, strategy


def test_a_plan_is_predicted_from_its_whole_compiled_step(planner):
    """A plan's prediction and collectives are those of its whole step, priced once."""
    plan = planner.plan(strategy="tp")
    priced = planner.pricer.price(plan.best.batch, plan.specs)
    assert plan.predicted_step_ms == pytest.approx(priced.seconds * 1e3)
    assert plan.predicted_memory_bytes == priced.memory_bytes
    assert plan.collectives == priced.collectives
    # Megatron pairs: the row layer's output summed over the devices, no weight gathered.
    assert plan.collectives["all-reduce"] >= 1 and plan.collectives["all-gather"] == 0


def test_a_strategy_with_no_layout_for_a_layer_says_which():
    """Tensor parallelism of a linear pair whose inner width the ``model`` axis does not
    divide is not a plan: the error names the layers and the layout, and the free plan
    still comes back with every plan it compared."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import torchspmd as xs

    torch.manual_seed(0)
    narrow = nn.Sequential(nn.Linear(16, 3), nn.GELU(), nn.Linear(3, 16))
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    planner = Planner(narrow, xs.Mesh(np.arange(8), (4, 2), ("data", "model")), (x, y),
                      loss_fn=lambda m, x, y: F.mse_loss(m(x), y))
    with pytest.raises(ValueError, match=r"'tp' is not a plan .* no layout of it for 0\+2 "
                                         r"\(megatron\(model\)\)"):
        planner.plan(strategy="tp")
    assert not any(p.name.endswith("tp") for p in planner.plan().priced)


def _tp_plan(optimizer):
    planner = Planner(model(), mesh(), data()[0], loss_fn=mse, optimizer=optimizer)
    return planner.plan(strategy="tp")


def test_a_plans_memory_counts_the_users_optimizer_state():
    """A plan's memory counts the user's kind of optimizer state: AdamW's two moments,
    laid out like their parameters, need two more copies of each device's parameter
    shards than plain SGD, SGD with momentum (given as an instance) one more."""
    adamw = _tp_plan(None)
    params = sum(shard_bytes(p.shape, adamw.specs[name], p.element_size(), mesh())
                 for name, p in model().named_parameters())
    sgd = _tp_plan(torch.optim.SGD).predicted_memory_bytes
    momentum = _tp_plan(torch.optim.SGD(model().parameters(), lr=0.1, momentum=0.9))
    assert adamw.predicted_memory_bytes - sgd == pytest.approx(2 * params, rel=0.25)
    assert momentum.predicted_memory_bytes - sgd == pytest.approx(params, rel=0.25)


def test_an_optimizer_that_is_not_one_is_refused():
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        Planner(model(), mesh(), data()[0], loss_fn=mse, optimizer="adamw")
