"""A compiled step trains exactly as CPU PyTorch does, for the common optimizers."""

import pytest
import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, batches, cpu_losses, mlp, on_device, train_step

OPTIMIZERS = {
    "momentum": lambda p, f: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=f),
    "adam": lambda p, f: torch.optim.Adam(p, lr=0.01, foreach=f),
    "adamw": lambda p, f: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=f),
}


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_compiled_training_matches_cpu(name, foreach):
    def make(params):
        return OPTIMIZERS[name](params, foreach)

    data = batches(3)
    expected, cpu_model = cpu_losses(make, data)
    model = mlp(DEVICE)
    step = xs.compile(train_step(model, make(model.parameters())))
    losses = [step(*on_device(x, y)).item() for x, y in data]
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)


def test_after_warm_up_and_capture_every_call_is_a_replay():
    model = mlp(DEVICE)
    step = xs.compile(train_step(model, torch.optim.Adam(model.parameters(), lr=0.01)))
    data = batches(5)
    step(*on_device(*data[0]))  # warm-up: Adam's moments and p.grad appear
    step(*on_device(*data[1]))  # capture
    before = xs.metrics()
    for x, y in data[2:]:
        step(*on_device(x, y))
    after = xs.metrics()
    assert after["step_replays"] - before["step_replays"] == 3
    assert after["step_captures"] == before["step_captures"]
    assert after["graphs_compiled"] == before["graphs_compiled"]
    assert after["ops_traced"] == before["ops_traced"]  # no Python ran per op


def test_parameters_keep_their_identity():
    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = [id(p) for p in model.parameters()]
    step = xs.compile(train_step(model, opt))
    for x, y in batches(3):
        step(*on_device(x, y))
    assert [id(p) for p in model.parameters()] == ids
    assert all(id(p) in {id(q) for q in opt.param_groups[0]["params"]} for p in model.parameters())
    assert all(p in opt.state for p in model.parameters())


def test_an_optimizer_over_cpu_parameters_the_step_can_reach_is_left_alone():
    """A CPU reference run beside the compiled one, its optimizer in the same list the step
    closes over: the step makes only its own optimizer replayable (capturable, a device
    lr), so the CPU one keeps training on the CPU."""
    data = batches(3)
    cpu_model, model = mlp("cpu"), mlp(DEVICE)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (cpu_model, model)]
    step = xs.compile(lambda x, y: train_step(model, opts[1])(x, y))
    for x, y in data:
        want = train_step(cpu_model, opts[0])(x, y).item()
        torch.testing.assert_close(step(*on_device(x, y)).item(), want, rtol=1e-5, atol=1e-6)
    assert not opts[0].param_groups[0]["capturable"]
    assert isinstance(opts[0].param_groups[0]["lr"], float)
    assert_params_close(model, cpu_model)


# Optimizers whose update reads the step count: CPU PyTorch computes from it in Python
# floats (double precision), e.g. Adam's ``1 - beta2 ** step``.
COUNTING = {
    "adam": lambda p, f: torch.optim.Adam(p, lr=0.01, foreach=f),
    "adamw": lambda p, f: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=f),
    "adamax": lambda p, f: torch.optim.Adamax(p, lr=0.01, foreach=f),
    "adagrad": lambda p, f: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.3, foreach=f),
}


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", list(COUNTING))
def test_step_counts_give_cpus_double_precision_bias_corrections(name, foreach):
    """In float64 a compiled step equals CPU's to float64's rounding. A float32 count
    (PyTorch's capturable default) put ``1 - 0.999 ** 1`` 1.3e-5 off and every Adam
    parameter ~1e-5 off CPU's after a few steps, in float32 models too."""
    if name == "adagrad" and not foreach:
        pytest.skip("Adagrad(foreach=False) reads its count on the host: refused in a step")
    data = [(x.double(), y.double()) for x, y in batches(4)]
    cpu_model = mlp("cpu").double()
    cpu_step = train_step(cpu_model, COUNTING[name](cpu_model.parameters(), foreach))
    model = mlp("cpu").double().to(DEVICE)
    opt = COUNTING[name](model.parameters(), foreach)
    step = xs.compile(train_step(model, opt))
    for x, y in data:
        torch.testing.assert_close(step(*on_device(x, y)).item(), cpu_step(x, y).item(),
                                   rtol=1e-13, atol=1e-15)
    for (label, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-12, atol=1e-14, msg=label)


def test_state_dict_holds_the_float64_counters_themselves_and_loads_into_a_cpu_optimizer():
    """A checkpoint loaded in place into ``opt.state_dict()`` must reach the counters."""
    model = mlp(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = xs.compile(train_step(model, opt))
    for x, y in batches(3):
        step(*on_device(x, y))
    counts = [s["step"] for s in opt.state_dict()["state"].values()]
    assert all(c is s["step"] and c.dtype == torch.float64 for c, s in zip(counts, opt.state.values()))
    cpu_model = mlp("cpu")
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=0.01)
    cpu_opt.load_state_dict(opt.state_dict())
    assert [s["step"].item() for s in cpu_opt.state.values()] == [3.0] * 4
