"""Adam's per-parameter step counters travel through a compiled step as one value.

PyTorch keeps ``state[p]["step"]`` per parameter and advances them all together. While
they hold one number, the replayed program reads one counter, advances it once and
returns it once; every counter tensor then holds that result, and the optimizer's state
reads as on the CPU. A counter set apart by hand makes the step capture again, with
the counters apart (they stay apart until the step is captured again), and training goes
on exactly as on the CPU.
"""

import copy

import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, batches, mlp, on_device, train_step


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _pair():
    """The same model and optimizer on the CPU and on the spmd device (compiled)."""
    cpu_model, model = mlp("cpu"), mlp(DEVICE)
    cpu_opt, opt = _adamw(cpu_model.parameters()), _adamw(model.parameters())
    return cpu_model, cpu_opt, train_step(cpu_model, cpu_opt), model, opt, xs.compile(
        train_step(model, opt))


def _assert_state_close(opt, cpu_opt):
    for state, cpu_state in zip(opt.state.values(), cpu_opt.state.values()):
        for key in ("step", "exp_avg", "exp_avg_sq"):  # counts are float64 on the device
            torch.testing.assert_close(state[key].cpu(), cpu_state[key].cpu(), rtol=1e-5, atol=1e-6,
                                       msg=key, check_dtype=key != "step")


def _outputs(step) -> int:
    return xs.debug.program_size(step.optimized_hlo()).outputs


def test_equal_counters_train_as_on_cpu_and_read_back_per_parameter():
    cpu_model, cpu_opt, cpu_step, model, opt, step = _pair()
    for x, y in batches(5):
        cpu_step(x, y)
        step(*on_device(x, y))
    assert_params_close(model, cpu_model)
    _assert_state_close(opt, cpu_opt)
    assert [s["step"].item() for s in opt.state.values()] == [5.0] * 4


def test_the_program_returns_one_counter_for_all_parameters():
    _, _, _, model, opt, step = _pair()
    data = batches(4)
    for x, y in data[:3]:
        step(*on_device(x, y))
    shared = _outputs(step)
    next(iter(opt.state.values()))["step"].fill_(7.0)  # one counter apart from the others
    step(*on_device(*data[3]))
    # Apart, each of the 4 counters is an output of its own again.
    assert _outputs(step) == shared + 3


def test_a_counter_set_by_hand_makes_the_step_capture_again_and_stays_exact():
    cpu_model, cpu_opt, cpu_step, model, opt, step = _pair()
    data = batches(6)
    for i, (x, y) in enumerate(data):
        if i == 3:
            before = xs.metrics()
            for o in (opt, cpu_opt):
                list(o.state.values())[1]["step"].fill_(100.0)
        cpu_step(x, y)
        step(*on_device(x, y))
    assert xs.metrics()["step_recaptures_state"] == before["step_recaptures_state"] + 1
    assert_params_close(model, cpu_model)
    _assert_state_close(opt, cpu_opt)


def test_loading_a_cpu_optimizers_state_between_calls_trains_on_as_on_cpu():
    cpu_model, cpu_opt, cpu_step, model, opt, step = _pair()
    for i, (x, y) in enumerate(batches(6)):
        if i == 3:  # as from a checkpoint file: tensors of its own, not the CPU's
            opt.load_state_dict(copy.deepcopy(cpu_opt.state_dict()))
        cpu_step(x, y)
        step(*on_device(x, y))
    assert_params_close(model, cpu_model)
    _assert_state_close(opt, cpu_opt)


def test_the_state_dict_of_shared_counters_loads_into_a_cpu_optimizer():
    cpu_model, cpu_opt, cpu_step, model, opt, step = _pair()
    for x, y in batches(3):
        cpu_step(x, y)
        step(*on_device(x, y))
    fresh = _adamw(mlp("cpu").parameters())
    fresh.load_state_dict(opt.state_dict())
    assert [s["step"].item() for s in fresh.state.values()] == [3.0] * 4
    _assert_state_close(opt, fresh)
