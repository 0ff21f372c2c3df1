"""Learning-rate schedules: Adam's lr is a program input; hand-set floats are honoured."""

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


def test_a_scheduler_changes_adams_lr_without_recapture_or_recompile():
    def adam(p):
        return torch.optim.Adam(p, lr=0.05)

    def schedule(opt):
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    data = batches(6)
    expected, cpu_model = _run("cpu", adam, data, schedule)
    before = xs.metrics()
    losses, model = _run(DEVICE, adam, data, schedule, compiled=True)
    after = xs.metrics()
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu_model)
    assert after["step_captures"] - before["step_captures"] == 2  # warm-up, capture
    assert after["step_replays"] - before["step_replays"] == 4


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
