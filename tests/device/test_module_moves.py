"""``model.to("spmd")`` gives each parameter a new ``nn.Parameter`` on the device, as
PyTorch/XLA's ``model.to(xla_device)`` does: an optimizer and parameter hooks are made
after the move. Module hooks move with the module and act on the device as on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchspmd

X = torch.linspace(-1, 1, 24).reshape(4, 6)


def _hooked() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    model[0].register_forward_hook(lambda module, inputs, out: out * 0.5)
    model[2].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 2,))
    return model


def test_moving_a_module_makes_new_parameters_and_leaves_the_old_ones_on_the_cpu():
    model = nn.Linear(6, 3)
    old = model.weight
    model.to("spmd")
    assert model.weight is not old and isinstance(model.weight, nn.Parameter)
    assert model.weight.device.type == "spmd" and old.device.type == "cpu"


def test_an_optimizer_made_before_the_move_holds_the_cpu_parameters():
    model = nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("spmd")
    assert all(p.device.type == "cpu" for p in opt.param_groups[0]["params"])


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
def test_module_hooks_move_with_the_module_and_give_cpus_gradients(compiled):
    cpu = _hooked()
    dev = copy.deepcopy(cpu).to("spmd")

    def loss_of(model, x):
        loss = model(x).pow(2).sum()
        loss.backward()
        return loss

    step = torchspmd.compile(lambda x: loss_of(dev, x)) if compiled else (lambda x: loss_of(dev, x))
    for _ in range(2):
        for model in (cpu, dev):
            model.zero_grad()
        torch.testing.assert_close(step(X.to("spmd")).cpu(), loss_of(cpu, X))
        for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad)


@pytest.mark.parametrize("move", [lambda m: m.to("spmd"),
                                  lambda m: torch.zeros(2, 2).to("spmd").copy_(m.weight)],
                         ids=["module.to", "copy_ from a meta tensor"])
def test_a_module_on_the_meta_device_is_refused_with_pytorchs_advice(move):
    """A meta tensor has no data: PyTorch's own error and advice (``to_empty``), not a
    numpy conversion error."""
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor.*to_empty"):
        move(nn.Linear(2, 2, device="meta"))


def test_to_empty_then_load_state_dict_gives_cpus_values():
    """The big-model pattern: build on the meta device, materialize on the spmd device with
    ``to_empty``, load the weights."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    with torch.device("meta"):
        empty = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = empty.to_empty(device="spmd")
    model.load_state_dict(cpu.state_dict())
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x.to("spmd")).cpu(), cpu(x))
