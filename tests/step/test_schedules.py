"""Learning-rate schedules: Adam's lr is a program input; hand-set floats are honoured.

Between calls ``group["lr"]`` is the user's own number, as on CPU: a compiled call lends
the group a device scalar holding it and gives the number back at its end.
"""

import pytest
import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, batches, mlp, on_device, train_step


def _run(device, make_opt, data, schedule=None, compiled=False, hand_set=None):
    model = mlp(device)
    opt = make_opt(model.parameters())
    sched = schedule(opt) if schedule else None
    step = train_step(model, opt)
    step = xs.compile(step) if compiled else step
    losses = []
    for i, (x, y) in enumerate(data):
        if hand_set:
            opt.param_groups[0]["lr"] = hand_set[i]
        x, y = (on_device(x, y) if device != "cpu" else (x, y))
        losses.append(step(x, y).item())
        if sched:
            sched.step()
    return losses, model


SCHEDULES = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5 ** e),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_scheduler_changes_adams_lr_without_recapture_or_recompile(name):
    def adam(p):
        return torch.optim.Adam(p, lr=0.05)

    schedule = SCHEDULES[name]

    data = batches(6)
    expected, cpu_model = _run("cpu", adam, data, schedule)
    before = xs.metrics()
    losses, model = _run(DEVICE, adam, data, schedule, compiled=True)
    after = xs.metrics()
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)
    assert after["step_captures"] - before["step_captures"] == 2  # warm-up, capture
    assert after["step_replays"] - before["step_replays"] == 4


@pytest.mark.parametrize("name", ["LambdaLR", "CosineAnnealingLR"])
def test_a_scheduled_lr_reaches_the_step_without_a_program_of_its_own(name):
    model = mlp(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = (torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.9 ** epoch)
             if name == "LambdaLR" else torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10))
    step = xs.compile(train_step(model, opt))
    programs = 0
    for i, (x, y) in enumerate(batches(8)):
        x, y = on_device(x, y)
        before = xs.metrics()["executions"]
        step(x, y)
        sched.step()  # Python floats: no device work of its own
        programs += xs.metrics()["executions"] - before if i >= 4 else 0
    assert programs == 4  # one program per step


def test_between_calls_the_lr_is_the_users_number_and_its_history_is_cpus():
    def adam(p):
        return torch.optim.Adam(p, lr=0.05)

    histories = []
    for device, compiled in (("cpu", False), (DEVICE, True)):
        model = mlp(device)
        opt = adam(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        step = train_step(model, opt)
        step = xs.compile(step) if compiled else step
        history = []
        for x, y in batches(5):
            step(*((x, y) if device == "cpu" else on_device(x, y)))
            sched.step()
            history.append(opt.param_groups[0]["lr"])  # kept: a snapshot on CPU
        histories.append(history)
    assert all(type(lr) is float for lr in histories[1])
    assert histories[1] == histories[0]


def test_a_hand_set_float_lr_is_used_by_the_next_call():
    def sgd(p):
        return torch.optim.SGD(p, lr=0.1, momentum=0.9)

    data = batches(5)
    lrs = [0.1, 0.1, 0.1, 0.01, 0.3]
    expected, cpu_model = _run("cpu", sgd, data, hand_set=lrs)
    before = xs.metrics()["step_recaptures_hyperparameters"]
    losses, model = _run(DEVICE, sgd, data, compiled=True, hand_set=lrs)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)
    assert xs.metrics()["step_recaptures_hyperparameters"] - before == 2  # shown in metrics


def test_a_hand_set_float_lr_on_adam_goes_into_its_device_scalar():
    def adam(p):
        return torch.optim.Adam(p, lr=0.05)

    data = batches(4)
    lrs = [0.05, 0.05, 0.01, 0.02]
    expected, cpu_model = _run("cpu", adam, data, hand_set=lrs)
    losses, model = _run(DEVICE, adam, data, compiled=True, hand_set=lrs)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)


def test_one_cycle_momentum_changes_adams_betas_each_step_as_on_cpu():
    """OneCycleLR's cycle_momentum rewrites Adam's ``betas`` tuple every step: a changed
    tuple is a changed hyperparameter, so each call captures again (correct, slower)."""

    def adam(p):
        return torch.optim.Adam(p, lr=0.01)

    def one_cycle(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)

    data = batches(6)
    expected, cpu_model = _run("cpu", adam, data, one_cycle)
    before = xs.metrics()["step_recaptures_hyperparameters"]
    losses, model = _run(DEVICE, adam, data, one_cycle, compiled=True)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)
    assert xs.metrics()["step_recaptures_hyperparameters"] > before


def _stepping_inside(make_opt, change):
    """A compiled step that runs ``change(opt, sched)`` after its optimizer step."""
    model = mlp(DEVICE)
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    @xs.compile
    def step(x, y):
        loss = train_step(model, opt)(x, y)
        change(opt, sched)
        return loss

    return step, opt


@pytest.mark.parametrize("make_opt", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                      lambda p: torch.optim.Adam(p, lr=0.1)],
                         ids=["SGD", "Adam"])
def test_a_scheduler_stepped_inside_the_step_is_refused_by_name(make_opt):
    """A replay runs no Python: the schedule would stop at the capture's lr."""
    step, opt = _stepping_inside(make_opt, lambda opt, sched: sched.step())
    with pytest.raises(xs.step.HostStateError, match=r"advanced the learning-rate scheduler "
                                                     r"StepLR.*outside the compiled step"):
        step(*on_device(*batches(1)[0]))
    # The refused call did not happen: the schedule and the learning rate are as before.
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.1)


def test_a_hyperparameter_set_inside_the_step_is_refused_by_name():
    def halve(opt, sched):
        opt.param_groups[0]["momentum"] = 0.5

    step, _ = _stepping_inside(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), halve)
    with pytest.raises(xs.step.HostStateError, match=r"changed its optimizer's 'momentum' in "
                                                     r"param group 0 \(0.9 -> 0.5\)"):
        step(*on_device(*batches(1)[0]))


def test_a_float_set_in_place_of_the_users_device_lr_leaves_that_tensor_alone():
    model = mlp(DEVICE)
    mine = torch.tensor(0.05, device=DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=mine)
    step = xs.compile(train_step(model, opt))
    for i, (x, y) in enumerate(batches(4)):
        if i == 2:
            opt.param_groups[0]["lr"] = 0.01
        step(*on_device(x, y))
    assert mine.item() == pytest.approx(0.05)
    assert opt.param_groups[0]["lr"] == 0.01
