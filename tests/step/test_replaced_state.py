"""State replaced between calls is the state the next call uses.

A replay finds its state through the containers it was captured with: the optimizer's
``state`` and ``param_groups``, each group's parameters, each parameter's state dict,
each submodule in its parent. ``optimizer.load_state_dict`` (resuming from a checkpoint),
assigning a new submodule, a parameter added to a group or frozen (``requires_grad``),
``model.eval()`` / ``model.train()``, a new optimizer under the name the step uses,
change what the step would do; the next call then captures the step again instead of
replaying the old computation. Each test compares every parameter with CPU PyTorch doing
the same.
"""

import copy

import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, assert_params_close, batches, mlp, on_device, train_step


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def _side_by_side(change, make_opt=_adam, steps: int = 5):
    """Train a CPU model and a compiled spmd copy step by step; before step 3, call
    ``change(cpu_model, cpu_opt)`` and ``change(model, opt)``. Returns both sides."""
    cpu_model, model = mlp("cpu"), mlp(DEVICE)
    cpu_opt, opt = make_opt(cpu_model), make_opt(model)
    cpu_step, step = train_step(cpu_model, cpu_opt), xs.compile(train_step(model, opt))
    for i, (x, y) in enumerate(batches(steps)):
        if i == 3:
            change(cpu_model, cpu_opt)
            change(model, opt)
        cpu_step(x, y)
        step(*on_device(x, y))
    assert_params_close(model, cpu_model)
    return (cpu_model, cpu_opt), (model, opt)


def test_loading_another_optimizer_state_between_calls_is_used_by_the_next_call():
    # A checkpoint from another run: moments and counters unlike this run's.
    other = mlp("cpu", seed=3)
    other_opt = _adam(other.parameters())
    other_step = train_step(other, other_opt)
    for x, y in batches(3, seed=7):
        other_step(x, y)
    checkpoint = copy.deepcopy(other_opt.state_dict())

    def load(model, opt):
        opt.load_state_dict(copy.deepcopy(checkpoint))

    (_, cpu_opt), (_, opt) = _side_by_side(load, lambda m: _adam(m.parameters()), steps=6)
    for state, cpu_state in zip(opt.state.values(), cpu_opt.state.values()):
        for key in ("step", "exp_avg", "exp_avg_sq"):  # counts are float64 on the device
            torch.testing.assert_close(state[key].cpu(), cpu_state[key], rtol=1e-5, atol=1e-6,
                                       check_dtype=key != "step")


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_submodule_replaced_between_calls_is_the_one_the_next_call_trains():
    def new_head(model, opt):  # a fresh head, in the model and in the optimizer
        torch.manual_seed(5)
        model[2] = torch.nn.Linear(16, 4).to(next(model.parameters()).device)
        opt.param_groups[0]["params"][2:] = list(model[2].parameters())

    _side_by_side(new_head, _sgd)


def test_a_parameter_frozen_between_calls_stops_training_as_on_cpu():
    def freeze(model, opt):  # fine-tuning: the first layer stops learning
        model[0].weight.requires_grad_(False)

    _side_by_side(freeze, lambda m: _adam(m.parameters()))


def test_a_parameter_appended_to_a_group_between_calls_is_trained_as_on_cpu():
    def join(model, opt):  # the head joins the first group
        opt.param_groups[0]["params"] += list(model[2].parameters())

    _side_by_side(join, lambda m: torch.optim.SGD(list(m.parameters())[:2], lr=0.1))


def test_model_eval_and_train_between_calls_switch_dropout_as_on_cpu():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5),
                                    torch.nn.Linear(16, 4))
    model = copy.deepcopy(cpu_model).to(DEVICE)
    step = xs.compile(lambda x: model(x).sum())
    x = batches(1)[0][0]
    for _ in range(3):  # captured in training mode: dropout on
        step(x.to(DEVICE))
    for m in (model, cpu_model):
        m.eval()
    evaluated = step(x.to(DEVICE)).item()
    torch.testing.assert_close(evaluated, cpu_model(x).sum().item(), rtol=1e-5, atol=1e-6)
    model.train()
    trained = step(x.to(DEVICE)).item()  # dropout on again: not the evaluation's value
    assert trained != evaluated
    model.eval()
    assert step(x.to(DEVICE)).item() == evaluated


def test_steps_that_set_the_mode_themselves_replay_in_turn_and_leave_it_set():
    """``model.train()`` in a training step and ``model.eval()`` in an evaluation step:
    each replays (a plan per mode the call starts in) and leaves the mode as its Python
    would, though a replay runs none."""
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5),
                                    torch.nn.Linear(16, 4))
    model = copy.deepcopy(cpu_model).to(DEVICE)
    cpu_opt, opt = _adam(cpu_model.parameters()), _adam(model.parameters())

    def sides(m, o):
        def train(x, y):
            m.train()
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m[0](x), y.repeat(1, 4))  # no dropout
            loss.backward()
            o.step()
            return loss

        def evaluate(x):
            m.eval()
            with torch.no_grad():
                return m(x).sum()

        return train, evaluate

    cpu_train, cpu_eval = sides(cpu_model, cpu_opt)
    train, evaluate = (xs.compile(f) for f in sides(model, opt))
    captures = xs.metrics()["step_captures"]
    for x, y in batches(8):
        cpu_train(x, y)
        train(*on_device(x, y))
        assert model.training
        torch.testing.assert_close(evaluate(x.to(DEVICE)).item(), cpu_eval(x).item(),
                                   rtol=1e-5, atol=1e-5)
        assert not model.training
    assert_params_close(model, cpu_model)
    # Adam's warm-up, a training plan per starting mode, an evaluation plan: then replays.
    assert xs.metrics()["step_captures"] - captures <= 4


def _momentum(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _halved_state(model):
    return {k: v.detach().cpu() * 0.5 for k, v in model.state_dict().items()}


def test_parameters_replaced_in_the_module_are_the_ones_the_next_call_reads():
    """``load_state_dict(..., assign=True)`` puts new parameters in the module while the
    optimizer keeps the old ones (on the CPU too): the step's forward reads the new ones,
    its update goes to the old ones."""
    def change(model, opt):
        state = _halved_state(model)
        device = next(model.parameters()).device
        model.load_state_dict({k: v.to(device) for k, v in state.items()}, assign=True)

    (cpu_model, cpu_opt), (model, opt) = _side_by_side(change, make_opt=_momentum)
    assert_params_close(model, cpu_model)
    for p, q in zip(opt.param_groups[0]["params"], cpu_opt.param_groups[0]["params"]):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5)


def test_a_groups_parameter_list_replaced_is_the_one_the_next_call_updates():
    def change(model, opt):
        state = _halved_state(model)
        device = next(model.parameters()).device
        model.load_state_dict({k: v.to(device) for k, v in state.items()}, assign=True)
        opt.param_groups[0]["params"] = list(model.parameters())

    (cpu_model, _), (model, _) = _side_by_side(change, make_opt=_momentum)
    assert_params_close(model, cpu_model)


def test_a_new_optimizer_bound_to_the_steps_variable_is_the_one_the_next_call_uses():
    cpu_model, model = mlp("cpu"), mlp(DEVICE)
    cpu_opt, opt = _adam(cpu_model.parameters()), _adam(model.parameters())

    def cpu_step(x, y):
        return train_step(cpu_model, cpu_opt)(x, y)

    @xs.compile
    def step(x, y):
        return train_step(model, opt)(x, y)

    for i, (x, y) in enumerate(batches(6)):
        if i == 3:  # a fresh optimizer under the same name: its moments start at zero
            cpu_opt, opt = _adam(cpu_model.parameters()), _adam(model.parameters())
        cpu_step(x, y)
        step(*on_device(x, y))
    assert_params_close(model, cpu_model)


def test_a_list_of_tensors_shortened_between_calls_is_read_as_it_is_now():
    """A slot that is gone (a list the step reads, popped) means capture again, never an
    internal IndexError from the check."""
    buffers = [torch.ones(3).to(DEVICE), (2 * torch.ones(3)).to(DEVICE)]
    step = xs.compile(lambda x: x + sum(buffers))
    x = torch.zeros(3).to(DEVICE)
    for _ in range(3):
        assert step(x).cpu().tolist() == [3.0] * 3
    buffers.pop()
    assert step(x).cpu().tolist() == [1.0] * 3
