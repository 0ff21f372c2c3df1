"""PyTorch/XLA's einsum-based linear: CPU's values, and batch dims never flattened.

``nn.Linear`` on a ``(batch, seq, in)`` input is a reshape to 2-d, a matmul and a reshape
back; a sequence-sharded input loses its sharding there (XLA all-gathers it).
``XLAPatchedLinear`` computes forward and backward as einsums over the original dims, so
the output and the input's gradient keep the input's sharding.
"""

import numpy as np
import pytest
import torch
from torch import nn

import torchspmd
import torchspmd as xs
from torchspmd.parallel.linear import EinsumLinear

DEV = torchspmd.device()
SEQ = xs.Mesh(np.arange(8), (8,), ("seq",))
SEQ_SHARDED = "{devices=[1,8,1]0,1,2,3,4,5,6,7}"


def _layer_pair(bias=True):
    torch.manual_seed(0)
    cpu = nn.Linear(6, 4, bias=bias)
    dev = nn.Linear(6, 4, bias=bias).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


def _input():
    return torch.randn(3, 16, 6, generator=torch.Generator().manual_seed(1))


def test_forward_and_gradients_match_cpu():
    cpu, dev = _layer_pair()
    a = _input().requires_grad_()
    (cpu(a) ** 2).sum().backward()
    x = a.detach().to(DEV).requires_grad_()
    y = xs.xla_patched_nn_linear_forward(dev, x)
    (y ** 2).sum().backward()
    torch.testing.assert_close(y.cpu(), cpu(a).detach())
    torch.testing.assert_close(x.grad.cpu(), a.grad)
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad)
    torch.testing.assert_close(dev.bias.grad.cpu(), cpu.bias.grad)


def test_without_bias_matches_cpu():
    cpu, dev = _layer_pair(bias=False)
    a = _input()
    y = xs.XLAPatchedLinear.apply(a.to(DEV), dev.weight, None)
    torch.testing.assert_close(y.cpu(), cpu(a).detach())


def test_output_and_input_gradient_keep_the_sequence_sharding():
    _, dev = _layer_pair()
    x = _input().to(DEV).requires_grad_()
    xs.mark_sharding(x, SEQ, (None, "seq", None))
    y = xs.xla_patched_nn_linear_forward(dev, x)
    (y ** 2).sum().backward()
    torchspmd.sync()
    assert xs.get_sharding(y) == SEQ_SHARDED
    assert xs.get_sharding(x.grad) == SEQ_SHARDED
    assert torchspmd.debug.collectives()["all-gather"] == 0


def test_patch_replaces_nested_linears_and_keeps_their_parameters():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4))).to(DEV)
    weights = [model[0].weight, model[2][0].weight]
    xs.mark_sharding(model[0].weight, SEQ, ("seq", None))
    patched = xs.apply_xla_patch_to_nn_linear(model)
    assert patched is model
    assert isinstance(model[0], EinsumLinear) and isinstance(model[2][0], EinsumLinear)
    assert [model[0].weight, model[2][0].weight] == weights  # the same Parameter objects
    assert xs.get_sharding(model[0].weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


def test_patched_model_trains_like_the_cpu_model():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    dev = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    xs.apply_xla_patch_to_nn_linear(dev)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    a = _input()
    for _ in range(3):
        for model, opt, x in ((cpu, opt_cpu, a), (dev, opt_dev, a.to(DEV))):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        torchspmd.sync()
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu.detach())


def _autocast_works() -> bool:
    try:
        with torch.autocast("spmd", dtype=torch.bfloat16):
            torch.ones(2, device=DEV).to(torch.float32)
        return True
    except Exception:  # torch.autocast("spmd") needs the device's AMP support (issue 11 §2)
        return False


@pytest.mark.skipif(not _autocast_works(), reason="torch.autocast('spmd') is not available yet")
def test_under_autocast_computes_in_the_autocast_dtype_like_cpu_linear():
    cpu, dev = _layer_pair()
    a = _input()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = cpu(a)
    with torch.autocast("spmd", dtype=torch.bfloat16):
        y = xs.xla_patched_nn_linear_forward(dev, a.to(DEV))
    assert y.dtype == expected.dtype == torch.bfloat16
    # CPU adds the bias before rounding to bf16 (addmm), the einsum after: 1 bf16 ulp apart.
    torch.testing.assert_close(y.cpu(), expected.detach(), atol=4e-3, rtol=1.6e-2)
