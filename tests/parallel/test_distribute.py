"""xla_distribute_module (spec §1.10): partition_fn per submodule, input/output hooks."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import torchspmd
from torchspmd.parallel import auto_policy, xla_distribute_module
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

N = 8


def mesh() -> Mesh:
    return Mesh(np.arange(N), (4, 2), ("data", "model"))


def text_of(shape, m: Mesh, spec) -> str:
    t = torch.zeros(shape).to("spmd")
    mark_sharding(t, m, spec)
    return get_sharding(t)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def megatron(name: str, module: nn.Module, m: Mesh) -> None:
    """Column-parallel first layer, row-parallel second layer."""
    if name == "0":
        mark_sharding(module.weight, m, ("model", None))
        mark_sharding(module.bias, m, ("model",))
    elif name == "2":
        mark_sharding(module.weight, m, (None, "model"))


def test_partition_fn_sees_every_named_module_with_the_mesh():
    m, seen = mesh(), []
    model = mlp().to("spmd")
    xla_distribute_module(model, m, lambda name, mod, dm: seen.append((name, mod, dm)))
    assert [(n, mod) for n, mod, _ in seen] == list(model.named_modules())
    assert all(dm is m for _, _, dm in seen)


def test_partition_fn_shards_parameters():
    m = mesh()
    model = xla_distribute_module(mlp().to("spmd"), m, megatron)
    assert get_sharding(model[0].weight) == text_of((32, 16), m, ("model", None))
    assert get_sharding(model[2].weight) == text_of((8, 32), m, (None, "model"))


def test_returns_the_module_itself():
    model = mlp().to("spmd")
    assert xla_distribute_module(model, mesh()) is model


def test_input_fn_runs_before_forward_with_module_inputs_and_mesh():
    m, calls = mesh(), []

    def input_fn(module, inputs, dm):
        calls.append((module, dm))
        mark_sharding(inputs[0], dm, ("data", None))

    model = xla_distribute_module(mlp().to("spmd"), m, input_fn=input_fn)
    x = torch.randn(8, 16).to("spmd")
    model(x)
    assert calls == [(model, m)]
    assert get_sharding(x) == text_of((8, 16), m, ("data", None))


def test_input_fn_result_replaces_the_inputs():
    model = xla_distribute_module(mlp().to("spmd"), mesh(),
                                  input_fn=lambda mod, inputs, dm: (inputs[0] * 0,))
    out = model(torch.randn(4, 16).to("spmd"))
    expected = mlp()(torch.zeros(4, 16))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_output_fn_result_replaces_the_output():
    model = xla_distribute_module(mlp().to("spmd"), mesh(),
                                  output_fn=lambda mod, outputs, dm: outputs.cpu())
    assert model(torch.randn(4, 16).to("spmd")).device.type == "cpu"


def test_two_argument_input_fn_warns_and_still_works():
    calls = []
    with pytest.warns(UserWarning, match="Deprecating input_fn that takes two arguments"):
        model = xla_distribute_module(mlp().to("spmd"), mesh(),
                                      input_fn=lambda inputs, dm: calls.append(dm))
    model(torch.randn(4, 16).to("spmd"))
    assert len(calls) == 1


def test_input_fn_with_wrong_arity_raises():
    with pytest.raises(ValueError, match="input_fn should take in 3 arguments, but got 1"):
        xla_distribute_module(mlp(), mesh(), input_fn=lambda inputs: None)


def test_output_fn_with_wrong_arity_raises():
    with pytest.raises(ValueError, match="output_fn should take in 3 arguments, but got 4"):
        xla_distribute_module(mlp(), mesh(), output_fn=lambda a, b, c, d: None)


def test_auto_policy_is_not_supported():
    with pytest.raises(NotImplementedError, match="auto_policy .* is not supported"):
        xla_distribute_module(mlp(), mesh(), auto_policy)


def test_tensor_parallel_training_matches_cpu():
    m = mesh()
    cpu_model = mlp()
    model = xla_distribute_module(copy.deepcopy(cpu_model).to("spmd"), m, megatron,
                                  input_fn=lambda mod, inputs, dm:
                                  mark_sharding(inputs[0], dm, ("data", None)))
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, generator=gen), torch.randn(8, 8, generator=gen)) for _ in range(4)]
    losses = {}
    for device, net in (("spmd", model), ("cpu", cpu_model)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        losses[device] = []
        for x, y in data:
            loss = nn.functional.mse_loss(net(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device == "spmd":
                torchspmd.sync()
            losses[device].append(loss.item())
    np.testing.assert_allclose(losses["spmd"], losses["cpu"], rtol=1e-4)
