"""Gradient accumulation replays: a compiled micro-step reads the gradients the slots hold now.

The contract (``torchspmd/step/slot_reads.py``):

- a micro-step that adds to full gradients is captured once; after ``opt.zero_grad()``
  (gradients set to None) and a first micro-batch that makes new gradient tensors, it
  replays on those, whether the update runs outside or is compiled too;
- every parameter and gradient equals CPU PyTorch's, step after step;
- a gradient tensor the user kept from an earlier step is not written;
- gradients replaced by hand with new tensors are read and added to like CPU's;
- a slot the step empties (`zero_grad()` at its end) is emptied by every replay;
- a slot that holds something the plan cannot read as the same state (a view) makes the
  step capture again, with CPU's values.
"""

import torch
import torch.nn.functional as F

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, batches, mlp, on_device

MICRO = 2  # micro-batches per optimizer step


def _loop(device, compiled: bool, update_compiled: bool = False, steps: int = 4):
    """Train with MICRO micro-batches per step; the model and its gradients before each
    ``zero_grad()``, on the CPU."""
    model = mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)

    def micro(x, y):
        loss = F.mse_loss(model(x), y) / MICRO
        loss.backward()
        return loss

    def update():
        opt.step()
        opt.zero_grad()

    if compiled:
        micro = xs.compile(micro)
        update = xs.compile(update) if update_compiled else update
    grads = []
    for i, (x, y) in enumerate(batches(steps * MICRO)):
        micro(*((x, y) if device == "cpu" else on_device(x, y)))
        if i % MICRO == MICRO - 1:
            grads.append([p.grad.detach().cpu().clone() for p in model.parameters()])
            update()
    return model, grads


def _assert_grads_equal(actual, expected):
    for step, (a, e) in enumerate(zip(actual, expected)):
        for k, (ga, ge) in enumerate(zip(a, e)):
            torch.testing.assert_close(ga, ge, rtol=1e-5, atol=1e-6, msg=f"step {step}, grad {k}")


def test_micro_step_is_captured_once_and_replays_on_new_gradients():
    cpu, cpu_grads = _loop("cpu", compiled=False)
    xs.reset_metrics()
    model, grads = _loop(DEVICE, compiled=True)
    metrics = xs.metrics()
    # One capture with empty gradients, one with full ones (counted as a state change:
    # the first plan did not fit); then replays only.
    assert metrics["step_captures"] == 2, metrics
    assert metrics["step_recaptures_state"] == 1, metrics
    assert metrics["step_slot_follows"] == 3, metrics  # once per later optimizer step
    assert_params_close(model, cpu)
    _assert_grads_equal(grads, cpu_grads)


def test_compiled_update_too_replays_and_matches_cpu():
    cpu, cpu_grads = _loop("cpu", compiled=False)
    xs.reset_metrics()
    model, grads = _loop(DEVICE, compiled=True, update_compiled=True)
    metrics = xs.metrics()
    # The micro-step twice (as above); the update twice (AdamW makes its state on the
    # first call, a warm-up), then it replays too, following each step's new gradients.
    assert metrics["step_captures"] == 4, metrics
    assert metrics["step_slot_follows"] == 3 + 2, metrics
    assert_params_close(model, cpu)
    _assert_grads_equal(grads, cpu_grads)


def _micro_and_model():
    model = mlp(DEVICE)
    cpu = mlp("cpu")

    def step_of(m):
        def micro(x, y):
            F.mse_loss(m(x), y).backward()
        return micro

    return model, cpu, xs.compile(step_of(model)), step_of(cpu)


def test_a_gradient_kept_from_an_earlier_step_is_not_written():
    model, cpu, micro, cpu_micro = _micro_and_model()
    (x, y), (x2, y2) = batches(2)
    for _ in range(2):  # capture empty, then full
        micro(*on_device(x, y))
    kept = model[0].weight.grad
    kept_values = kept.cpu().clone()
    model.zero_grad()
    micro(*on_device(x2, y2))
    micro(*on_device(x2, y2))  # replays on the new gradients
    torch.testing.assert_close(kept.cpu(), kept_values, rtol=0, atol=0)
    cpu_micro(x2, y2)
    cpu_micro(x2, y2)
    torch.testing.assert_close(model[0].weight.grad.cpu(), cpu[0].weight.grad, rtol=1e-5, atol=1e-6)


def _grads_after_replacing(replace):
    """Both models' gradients after: micro-batch, micro-batch, ``replace(model)`` (new
    ``.grad`` tensors), micro-batch."""
    model, cpu, micro, cpu_micro = _micro_and_model()
    x, y = batches(1)[0]
    for m, step, args in ((model, micro, on_device(x, y)), (cpu, cpu_micro, (x, y))):
        step(*args)
        step(*args)
        replace(m)
        step(*args)
    return [(p.grad.cpu(), q.grad) for p, q in zip(model.parameters(), cpu.parameters())]


def test_a_gradient_set_to_a_view_captures_again_with_cpu_values():
    def to_a_view(m):
        m[0].weight.grad = torch.zeros(2, 16, 8, device=m[0].weight.device)[1]

    for actual, expected in _grads_after_replacing(to_a_view):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_gradients_replaced_by_hand_are_read_and_written_like_cpus():
    def by_hand(m):
        for p in m.parameters():
            p.grad = torch.full_like(p, 0.5)

    for actual, expected in _grads_after_replacing(by_hand):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_a_gradient_the_step_sets_to_none_is_none_after_every_replay():
    results = []
    for device in ("cpu", DEVICE):
        model = mlp(device)
        grads = [torch.full_like(p, 0.25) for p in model.parameters()]  # kept and reused
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def update():
            opt.step()
            opt.zero_grad()

        step = xs.compile(update) if device == DEVICE else update
        for _ in range(3):
            for p, g in zip(model.parameters(), grads):
                p.grad = g
            step()
            assert all(p.grad is None for p in model.parameters())
        results.append(model)
    assert_params_close(results[1], results[0])
