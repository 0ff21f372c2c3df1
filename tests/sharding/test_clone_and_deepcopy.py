"""``clone()`` and ``copy.deepcopy`` of a sharded tensor show its sharding at once.

As PyTorch/XLA's ``clone`` copies the sharding spec, the copy reports the source's
sharding before anything runs (not ``''`` until ``sync()``), and holds the same values.
"""

import copy

import numpy as np
import torch
from torch import nn

import torchspmd
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

DEV = torchspmd.device()
MESH = Mesh(np.arange(8), (2, 4), ("a", "b"))
TILED = "{devices=[2,4]0,1,2,3,4,5,6,7}"
CPU = torch.arange(32.).reshape(4, 8)


def _marked():
    x = CPU.to(DEV)
    mark_sharding(x, MESH, ("a", "b"))
    return x


def test_clone_of_marked_data_shows_its_sharding_before_sync():
    y = _marked().clone()
    assert get_sharding(y) == TILED
    assert torch.equal(y.cpu(), CPU)


def test_clone_of_a_constrained_pending_value_shows_the_constraint():
    x = CPU.to(DEV) * 2
    mark_sharding(x, MESH, (None, "b"))
    y = x.clone()
    assert get_sharding(y) == get_sharding(x) != ""
    assert torch.equal(y.cpu(), CPU * 2)


def test_clone_of_computed_data_shows_the_layout_xla_chose():
    x = _marked() + 1
    torchspmd.sync()
    y = x.clone()
    assert get_sharding(y) == get_sharding(x) == TILED
    assert torch.equal(y.cpu(), CPU + 1)


def test_clone_of_unsharded_data_stays_unsharded():
    y = CPU.to(DEV).clone()
    assert get_sharding(y) == ""
    assert torch.equal(y.cpu(), CPU)


def test_deepcopy_of_a_sharded_tensor_shows_its_sharding_and_values():
    y = copy.deepcopy(_marked())
    assert get_sharding(y) == TILED
    assert torch.equal(y.cpu(), CPU)


def test_deepcopy_of_an_xla_sharded_tensor_keeps_spec_and_partition_spec():
    xst = mark_sharding(CPU.to(DEV), MESH, ("a", "b"))
    copied = copy.deepcopy(xst)
    assert copied.sharding_spec == TILED and copied.partition_spec == ("a", "b")
    assert torch.equal(copied.global_tensor.cpu(), CPU)


def test_deepcopy_of_a_module_keeps_its_parameters_sharding():
    layer = nn.Linear(8, 4).to(DEV)
    mark_sharding(layer.weight, MESH, ("a", "b"))
    twin = copy.deepcopy(layer)
    assert get_sharding(twin.weight) == TILED and isinstance(twin.weight, nn.Parameter)
    assert torch.equal(twin.weight.cpu(), layer.weight.cpu())


def test_changing_the_clone_leaves_the_source_unchanged():
    x = _marked()
    y = x.clone()
    y.add_(1)
    assert torch.equal(x.cpu(), CPU) and torch.equal(y.cpu(), CPU + 1)
    assert get_sharding(y) == TILED


def test_deepcopy_keeps_a_tensors_gradient_and_drops_a_parameters_as_on_cpu():
    cpu_t, cpu_p = CPU.clone().requires_grad_(), nn.Parameter(CPU.clone())
    dev_t, dev_p = CPU.to(DEV).requires_grad_(), nn.Parameter(CPU.to(DEV))
    for t, p in ((cpu_t, cpu_p), (dev_t, dev_p)):
        (t * 2 + p * 3).sum().backward()
    copied_t, copied_p = copy.deepcopy(dev_t), copy.deepcopy(dev_p)
    assert copy.deepcopy(cpu_p).grad is None and copied_p.grad is None
    torch.testing.assert_close(copied_t.grad.cpu(), copy.deepcopy(cpu_t).grad)
