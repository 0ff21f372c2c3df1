"""A compiled step that returns state returns the state, as PyTorch does.

``return model.weight`` returns the parameter itself in eager PyTorch: a reference kept
from one step shows what later steps wrote into it. Each replay returns the same: the
parameter, gradient, optimizer moment or argument itself, and a view of one as the same
view of its current data (``routes.AliasReturn``). Before, a replay returned a copy of
that step's value (held results read 1.3 off CPU's after five steps).
"""

import copy

import torch
import torch.nn.functional as F

import torchspmd as xs
from tests.step.helpers import DEVICE

STEPS = 5


def _data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 4, generator=g, dtype=torch.float64),
             torch.randn(5, 3, generator=g, dtype=torch.float64)) for _ in range(STEPS)]


def _run(device: str, compiled: bool, returns):
    """Train STEPS steps keeping every result; the results, read after the last step, and
    per step whether each returned tensor was the state object itself."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return (loss, *returns(model, opt, x))

    if compiled:
        step = xs.compile(step)
    kept, same = [], []
    for x, y in _data():
        x = x.to(device)
        result = step(x, y.to(device))
        kept.append(result)
        same.append([r is state for r, state in zip(result[1:], _states(model, opt, x))])
    return [[t.detach().cpu() for t in r] for r in kept], same


def _states(model, opt, x):
    return (model.weight, model.bias.grad, opt.state[model.weight]["momentum_buffer"], x)


def _assert_as_on_cpu(returns):
    expected, expected_same = _run("cpu", False, returns)
    got, same = _run(DEVICE, True, returns)
    assert same == expected_same
    for step, (row, want) in enumerate(zip(got, expected)):
        for i, (a, b) in enumerate(zip(row, want)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=f"step {step}, result {i}")


def test_returned_state_is_the_state_itself_and_shows_later_steps():
    _assert_as_on_cpu(lambda model, opt, x: _states(model, opt, x))


def test_a_returned_view_of_state_shows_later_steps():
    _assert_as_on_cpu(lambda model, opt, x: (model.weight[0], model.weight.detach(),
                                             model.bias.grad[:2], x[1:]))


def test_an_argument_written_in_place_and_returned_is_the_argument():
    _assert_as_on_cpu(lambda model, opt, x: (x.mul_(2),))


def test_a_new_value_is_still_a_new_tensor():
    _assert_as_on_cpu(lambda model, opt, x: (model.weight * 1, model.weight.detach().clone()))
