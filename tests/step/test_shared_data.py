"""Tensors that held the same data when a step was captured may differ later.

The recorded graph reads one leaf for two tensors holding one value (the same tensor
passed twice, a buffer that took an argument's data through a zero-copy ``copy_``, step
counters a replay left sharing one array). A replay reads that leaf from one place only,
so it must not run once the two differ: arguments that share data key the step's cache
apart from arguments that do not, and a storage that shared a source's data is checked
on every call (changed since, the step is captured again). An argument that is a
module's parameter is that parameter, and what the step writes into an argument that
views part of another tensor reaches that tensor. Each test compares with the same
calls on the CPU.
"""

import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, mlp, on_device, train_step


def test_one_tensor_passed_twice_then_two_tensors():
    step = xs.compile(lambda a, b: a * 2 + b)
    a, b = torch.ones(3), torch.full((3,), 5.0)
    a_dev, b_dev = on_device(a, b)
    for _ in range(2):
        torch.testing.assert_close(step(a_dev, a_dev).cpu(), a * 2 + a)
    torch.testing.assert_close(step(a_dev, b_dev).cpu(), a * 2 + b)
    torch.testing.assert_close(step(a_dev, a_dev).cpu(), a * 2 + a)


def test_a_buffer_sharing_an_arguments_data_then_changed_by_hand():
    a = torch.ones(3)
    a_dev = a.to(DEVICE)
    buf = torch.zeros(3).to(DEVICE)
    buf.copy_(a_dev)  # zero-copy: the buffer holds the argument's data
    step = xs.compile(lambda x: x + buf)
    for _ in range(2):
        torch.testing.assert_close(step(a_dev).cpu(), a + a)
    buf.fill_(10.0)
    torch.testing.assert_close(step(a_dev).cpu(), a + 10.0)


def _adamw_pair():
    cpu_model, model = mlp("cpu"), mlp(DEVICE)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return (cpu_model, cpu_opt, train_step(cpu_model, cpu_opt), model, opt,
            xs.compile(train_step(model, opt)))


def _batches(n: int):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(n)]


def test_batches_uploaded_ahead_and_kept_replay_without_capturing_again():
    # The argument's own storage is not "another tensor sharing its data": the batch of
    # the capture, still alive, holds other data than the next call's batch.
    model = mlp(DEVICE)
    step = xs.compile(train_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    cpu = mlp("cpu")
    cpu_step = train_step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1))
    data = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(k)), torch.randn(4, 4))
            for k in range(5)]
    uploaded = [on_device(x, y) for x, y in data]  # kept alive for the whole loop
    for k, ((x, y), (x_dev, y_dev)) in enumerate(zip(data, uploaded)):
        if k == 2:  # captured twice by now: without gradients, then with them
            before = xs.metrics()
        torch.testing.assert_close(step(x_dev, y_dev).cpu(), cpu_step(x, y))
    after = xs.metrics()
    assert after["step_captures"] == before["step_captures"]
    assert after["step_replays"] - before["step_replays"] == 3
    assert_params_close(model, cpu)


def test_a_step_counter_set_by_hand_after_a_capture_from_shared_counters():
    cpu_model, cpu_opt, cpu_step, model, opt, step = _adamw_pair()
    data = _batches(7)
    for x, y in data[:3]:  # the replays leave every counter holding one array
        cpu_step(x, y)
        step(*on_device(x, y))
    for group in (*opt.param_groups, *cpu_opt.param_groups):
        group["weight_decay"] = 0.05  # captured again, from the counters sharing one array
    for x, y in data[3:5]:
        cpu_step(x, y)
        step(*on_device(x, y))
    for o, p in ((opt, list(model.parameters())[1]), (cpu_opt, list(cpu_model.parameters())[1])):
        o.state[p]["step"].fill_(100.0)
    for x, y in data[5:]:
        cpu_step(x, y)
        step(*on_device(x, y))
    assert [s["step"].item() for s in opt.state.values()] == [7.0, 102.0, 7.0, 7.0]
    assert_params_close(model, cpu_model)
    for state, cpu_state in zip(opt.state.values(), cpu_opt.state.values()):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state[key].cpu(), cpu_state[key], rtol=1e-5, atol=1e-6)


def test_a_hyperparameter_change_captures_once():
    _, _, _, _, opt, step = _adamw_pair()
    data = _batches(6)
    for x, y in data[:3]:
        step(*on_device(x, y))
    before = xs.metrics()["step_captures"]
    for group in opt.param_groups:
        group["weight_decay"] = 0.05
    for x, y in data[3:]:
        step(*on_device(x, y))
    assert xs.metrics()["step_captures"] - before == 1


def test_a_parameter_passed_as_an_argument_and_updated_is_the_modules_parameter():
    def run(device, compiled: bool) -> list[float]:
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 3).to(device)

        def step(x, w):
            with torch.no_grad():
                w.mul_(0.9)  # lin's own weight or bias: lin(x) below reads it scaled
            return lin(x).detach(), w.detach()

        step = xs.compile(step) if compiled else step
        x = torch.arange(3.0).to(device)
        seen = [v for i in range(4) for out in step(x, lin.weight if i < 2 else lin.bias)
                for v in out.flatten().tolist()]
        return seen + [v for p in lin.parameters() for v in p.detach().cpu().flatten().tolist()]

    torch.testing.assert_close(run(DEVICE, compiled=True), run("cpu", compiled=False))


def test_what_the_step_writes_into_a_view_argument_reaches_its_base():
    def run(device, compiled: bool) -> list[float]:
        x = torch.arange(6.0).reshape(2, 3).to(device)

        def step(row):
            row.add_(1)
            return (row * 2,)

        step = xs.compile(step) if compiled else step
        seen = [v for i in range(3) for v in step(x[i % 2])[0].cpu().tolist()]
        return seen + x.cpu().flatten().tolist()

    assert run(DEVICE, compiled=True) == run("cpu", compiled=False)
