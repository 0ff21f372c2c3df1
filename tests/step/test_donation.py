"""Buffer donation: state the step overwrites gives its buffer to the step, unless another
tensor still holds that buffer (then the step gets a copy and the other tensor is intact),
or the step itself hands that buffer to another tensor (``old.copy_(w)`` before ``w`` is
updated: then the buffer is kept, and ``old`` holds it)."""

import weakref

import pytest
import torch

import torchspmd as xs
from torchspmd.debug import copied_arguments
from tests.step.helpers import DEVICE, batches, mlp, on_device, train_step


def _trained(steps: int = 4):
    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = xs.compile(train_step(model, opt))
    data = batches(steps)
    return model, step, data


def _model_and_step(device):
    """The MLP and its SGD step: compiled on the spmd device, eager on CPU."""
    model = mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = train_step(model, opt)
    return model, (xs.compile(step) if device != "cpu" else step)


def test_parameters_and_optimizer_state_are_donated_in_steady_state():
    model, step, data = _trained()
    before = xs.metrics()["donated_bytes"]
    for x, y in data:
        step(*on_device(x, y))
    state_bytes = 2 * sum(p.numel() * 4 for p in model.parameters())  # params + momentum
    assert xs.metrics()["donated_bytes"] - before >= state_bytes


def test_each_donated_buffer_goes_to_its_own_tensors_new_value():
    # As on the lazy path (tests/device/test_lazy_donation.py): in graph order, every
    # one of the 24 donated parameters and moments here was copied before the step.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = xs.compile(train_step(model, opt))
    for _ in range(4):
        step(*on_device(torch.randn(16, 16), torch.randn(16, 16)))
    donated = 3 * len(list(model.parameters()))
    assert copied_arguments(step.optimized_hlo()) <= donated // 4


def test_the_next_call_frees_what_the_last_one_consumed_once_it_launched():
    # Freed before a launch, the consumed arrays would delay it; freed by a read, they
    # would no longer offset the next call's new arrays in the count that starts Python's
    # garbage collections (test_garbage_collection.py). The next call frees them.
    model, step, data = _trained()
    for x, y in data[:2]:
        step(*on_device(x, y))
    x, y = on_device(*data[2])
    loss = step(x, y)
    batch = weakref.ref(x._h.value()[0].arrays[0])  # uploaded by the call
    del x, y
    loss.item()
    assert batch() is not None  # the call still holds its input, after a read too
    step(*on_device(*data[3]))
    assert batch() is None


def test_waiting_for_the_devices_frees_what_the_call_consumed():
    model, step, data = _trained()
    for x, y in data[:2]:
        step(*on_device(x, y))
    x, y = on_device(*data[2])
    step(x, y)
    batch = weakref.ref(x._h.value()[0].arrays[0])
    del x, y
    xs.wait_device_ops()
    assert batch() is None


def test_new_gradients_are_written_into_the_old_gradients_buffers():
    model, step, data = _trained()
    for x, y in data:
        step(*on_device(x, y))
    state = sum(p.numel() * 4 for p in model.parameters())
    # Parameters, momentum buffers and gradients: each output goes into an input buffer.
    assert step.memory_analysis().alias_size_in_bytes >= 3 * state


def test_a_view_of_an_old_gradient_keeps_its_value():
    model, step, data = _trained()
    for x, y in data[:2]:
        step(*on_device(x, y))
    row = model[0].weight.grad[0]  # its storage is the gradient's: not recycled
    expected = row.cpu()
    for x, y in data[2:]:
        step(*on_device(x, y))
    torch.testing.assert_close(row.cpu(), expected)
    assert not torch.equal(model[0].weight.grad[0].cpu(), expected)


def test_a_zero_copy_alias_of_a_parameter_keeps_its_value():
    model, step, data = _trained()
    weight = model[0].weight
    alias = torch.empty_like(weight)
    for i, (x, y) in enumerate(data):
        if i == 2:  # after capture: copy_ shares the parameter's buffer, no data moves
            alias.copy_(weight.detach())
            xs.sync()
            expected = weight.detach().cpu()
        step(*on_device(x, y))
    torch.testing.assert_close(alias.cpu(), expected)
    assert not torch.equal(weight.detach().cpu(), expected)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_snapshot_taken_in_the_step_before_an_update_keeps_the_old_value(sharded):
    """``copy_`` from an annotated tensor hands over its data as a new leaf: the same."""

    def run(device, compiled: bool) -> list[float]:
        w, old = torch.arange(8.0).to(device), torch.zeros(8).to(device)
        if sharded and compiled:
            xs.mark_sharding(w, xs.Mesh(list(range(8)), (8,)), (0,))

        def step(x):
            old.copy_(w)  # zero-copy: old takes w's buffer as it is
            w.mul_(2).add_(x)
            return w.sum()

        step = xs.compile(step) if compiled else step
        seen = []
        for i in range(4):
            seen += [float(step(torch.full((8,), float(i)).to(device))), *old.cpu().tolist()]
        return seen + w.cpu().tolist()

    assert run(DEVICE, compiled=True) == run("cpu", compiled=False)


def test_a_view_of_a_parameter_read_between_steps_follows_its_updates():
    # The view's value is computed at each read; the step then overwrites the parameter
    # in its own buffer: the next read must see the new data, as on CPU.
    def rows_per_step(device):
        model, step = _model_and_step(device)
        row = model[0].weight.detach()[1]
        rows = []
        for x, y in batches(5):
            step(x.to(device), y.to(device))
            rows.append(row.cpu().clone())  # on CPU, .cpu() is the live view itself
        return rows

    for got, expected in zip(rows_per_step(DEVICE), rows_per_step("cpu")):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_tensors_kept_from_earlier_steps_stay_readable():
    model, step, data = _trained(5)
    kept = []
    for x, y in data:
        loss = step(*on_device(x, y))
        kept.append((loss, model[2].bias.detach(), model[2].bias.grad))
    for loss, bias, grad in kept:
        assert torch.isfinite(loss.cpu())
        assert torch.isfinite(grad.cpu()).all()
    torch.testing.assert_close(kept[0][1].cpu(), model[2].bias.detach().cpu())  # a view: live


def test_gradients_kept_from_each_step_hold_that_steps_values_as_on_cpu():
    def grads_per_step(device):
        model, step = _model_and_step(device)
        kept = []
        for x, y in batches(5):
            step(x.to(device), y.to(device))
            kept.append(model[0].weight.grad)  # the next step drops it from .grad
        return [g.cpu() for g in kept]

    for got, expected in zip(grads_per_step(DEVICE), grads_per_step("cpu")):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_gradient_saved_by_an_autograd_graph_keeps_its_value_as_on_cpu():
    # Only the graph holds the old gradient (no Python reference): it is not recycled.
    def saved_grad_after_steps(device):
        model, step = _model_and_step(device)
        data = batches(5)
        for x, y in data[:3]:
            step(x.to(device), y.to(device))
        scale = torch.ones(4, requires_grad=True, device=device)
        total = (scale * model[2].bias.grad).sum()  # saves the gradient for backward
        float(total)  # computed: only autograd's saved tensor holds the gradient now
        for x, y in data[3:]:
            step(x.to(device), y.to(device))
        total.backward()
        return scale.grad.cpu()

    torch.testing.assert_close(saved_grad_after_steps(DEVICE), saved_grad_after_steps("cpu"),
                               rtol=1e-5, atol=1e-6)


def test_a_weakly_referenced_gradient_is_replaced_as_on_cpu():
    model, step, data = _trained()
    for x, y in data[:2]:
        step(*on_device(x, y))
    old = weakref.ref(model[0].weight.grad)
    step(*on_device(*data[2]))
    assert old() is None  # zero_grad() dropped it, as PyTorch does


def test_a_step_that_returns_a_parameter_keeps_both_readable():
    """The copy keeps each step's value; the state itself is returned, as in PyTorch, so
    every reference to it reads the last value (``tests/step/test_returned_state.py``)."""
    w = torch.ones(3).to(DEVICE)

    @xs.compile
    def step(x):
        w.mul_(x)
        return w * 1, w

    outs = [step(torch.full((3,), 2.0).to(DEVICE)) for _ in range(4)]
    assert [o[0].cpu()[0].item() for o in outs] == [2.0, 4.0, 8.0, 16.0]
    assert all(o[1] is w for o in outs)
    assert [o[1].cpu()[0].item() for o in outs] == [16.0] * 4
    torch.testing.assert_close(w.cpu(), torch.full((3,), 16.0))


def test_a_program_that_fails_to_start_leaves_the_state_as_it_was():
    model, step, data = _trained()
    for x, y in data[:3]:
        step(*on_device(x, y))
    before = [p.detach().cpu() for p in model.parameters()]
    plan = step._last

    def failing(*args):
        raise RuntimeError("device lost")

    compiled, plan.compiled = plan.compiled, failing
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            step(*on_device(*data[3]))
    finally:
        plan.compiled = compiled
    for p, expected in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), expected)
