"""FSDPv2 (spec §1.12): errors, parameter and output shardings, auto-wrapping, training vs CPU."""

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import torchspmd
from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
from torchspmd.parallel import fsdp_partition_spec
from torchspmd.sharding import (Mesh, get_global_mesh, get_sharding, mark_sharding,
                                set_global_mesh)

N = 8
ALL = ",".join(str(i) for i in range(N))


def fsdp_mesh() -> Mesh:
    return Mesh(np.arange(N), (N,), ("fsdp",))


def mesh_4x2() -> Mesh:
    return Mesh(np.arange(N), (4, 2), ("fsdp", "data"))


@pytest.fixture
def no_global_mesh():
    saved = get_global_mesh()
    set_global_mesh(None)
    yield
    set_global_mesh(saved)


def text_of(shape, mesh: Mesh, spec) -> str:
    """The sharding text a fresh tensor gets from ``mark_sharding(spec)``."""
    t = torch.zeros(shape).to("spmd")
    mark_sharding(t, mesh, spec)
    return get_sharding(t)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


# --- errors ----------------------------------------------------------------------------

def test_wrapping_a_wrapped_module_raises():
    model = FSDPv2(nn.Linear(4, 4), mesh=fsdp_mesh())
    with pytest.raises(RuntimeError, match="Cannot wrap a module that is already wrapped with FSDP"):
        FSDPv2(model, mesh=fsdp_mesh())


def test_module_without_forward_raises():
    with pytest.raises(RuntimeError, match=r"\*must define a `forward` method"):
        FSDPv2(nn.ModuleList([nn.Linear(4, 4)]), mesh=fsdp_mesh())


def test_no_mesh_and_no_global_mesh_raises(no_global_mesh):
    with pytest.raises(ValueError, match="No mesh is provided and no global mesh is set. "
                                         "Please provide a mesh."):
        FSDPv2(nn.Linear(4, 4))


def test_mesh_without_fsdp_axis_raises():
    with pytest.raises(ValueError, match="The mesh must have an axis named 'fsdp'."):
        FSDPv2(nn.Linear(4, 4), mesh=Mesh(np.arange(N), (N,), ("data",)))


def test_unnamed_mesh_raises_type_error():
    with pytest.raises(TypeError):
        FSDPv2(nn.Linear(4, 4), mesh=Mesh(np.arange(N), (N,)))


def test_extra_data_axis_not_in_mesh_raises():
    with pytest.raises(ValueError, match="The provided data axis is not in the mesh."):
        FSDPv2(nn.Linear(4, 4), mesh=fsdp_mesh(), extra_data_axis="data")


def test_auto_wrap_with_a_wrapped_submodule_raises():
    model = TwoLayers()
    model.fc1 = FSDPv2(model.fc1, mesh=fsdp_mesh())
    with pytest.raises(ValueError, match="Expected fc1 to NOT be SpmdFullyShardedDataParallel"):
        FSDPv2(model, mesh=fsdp_mesh(), auto_wrap_policy=lambda **kw: True)


# --- parameters ------------------------------------------------------------------------

def test_weight_sharded_on_its_largest_dim():
    model = FSDPv2(nn.Linear(128, 64), mesh=fsdp_mesh())
    assert get_sharding(model.module.weight) == f"{{devices=[1,8]{ALL}}}"  # (None, 'fsdp')


def test_bias_sharded_on_its_only_dim():
    model = FSDPv2(nn.Linear(128, 64), mesh=fsdp_mesh())
    assert get_sharding(model.module.bias) == f"{{devices=[8]{ALL}}}"


def test_weight_replicated_over_the_other_axes():
    mesh = mesh_4x2()
    model = FSDPv2(nn.Linear(128, 64), mesh=mesh)
    assert get_sharding(model.module.weight) == text_of((64, 128), mesh, (None, "fsdp"))


def test_global_mesh_is_used(no_global_mesh):
    set_global_mesh(fsdp_mesh())
    model = FSDPv2(nn.Linear(128, 64))
    assert get_sharding(model.module.weight) == f"{{devices=[1,8]{ALL}}}"


def test_already_sharded_parameters_are_kept():
    mesh = mesh_4x2()
    linear = nn.Linear(16, 64).to("spmd")
    mark_sharding(linear.weight, mesh, ("data", None))
    FSDPv2(linear, mesh=mesh)
    assert get_sharding(linear.weight) == text_of((64, 16), mesh, ("data", None))
    assert get_sharding(linear.bias) == text_of((64,), mesh, ("fsdp",))


def test_cpu_module_is_moved_to_the_device():
    model = FSDPv2(nn.Linear(4, 4), mesh=fsdp_mesh())
    assert all(p.device.type == "spmd" for p in model.parameters())


def test_tied_weights_stay_tied():
    model = nn.Sequential(nn.Embedding(8, 16), nn.Linear(16, 8, bias=False))
    model[1].weight = model[0].weight
    wrapped = FSDPv2(model, mesh=fsdp_mesh())
    assert wrapped[1].weight is wrapped[0].weight


def test_attributes_and_indexing_reach_the_wrapped_module():
    model = FSDPv2(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), mesh=fsdp_mesh())
    assert isinstance(model[1], nn.ReLU)
    assert model.module is model._orig_module


def test_partition_spec_helper():
    assert fsdp_partition_spec(torch.empty(64, 128), shard_maximal=True) == (None, "fsdp")
    assert fsdp_partition_spec(torch.empty(16, 4), extra_data_axis="data") == (("data", "fsdp"), None)
    assert fsdp_partition_spec(torch.empty(())) == ()


# --- outputs ---------------------------------------------------------------------------

def test_output_batch_is_sharded_over_fsdp():
    mesh = mesh_4x2()
    model = FSDPv2(nn.Linear(8, 4), mesh=mesh)
    out = model(torch.randn(16, 8).to("spmd"))
    torchspmd.sync()
    assert get_sharding(out) == text_of((16, 4), mesh, ("fsdp", None))


def test_output_with_extra_data_axis():
    mesh = mesh_4x2()
    model = FSDPv2(nn.Linear(8, 4), mesh=mesh, extra_data_axis="data")
    out = model(torch.randn(16, 8).to("spmd"))
    torchspmd.sync()
    assert get_sharding(out) == text_of((16, 4), mesh, (("data", "fsdp"), None))


class TupleOut(nn.Module):
    def __init__(self, first_is_tensor=True):
        super().__init__()
        self.fc, self.first_is_tensor = nn.Linear(8, 4), first_is_tensor

    def forward(self, x):
        y = self.fc(x)
        return (y, y.sum()) if self.first_is_tensor else ("name", y)


def test_tuple_output_warns_and_shards_the_first_element():
    mesh = fsdp_mesh()
    model = FSDPv2(TupleOut(), mesh=mesh)
    with pytest.warns(UserWarning, match="The output is a tuple, but only the first element"):
        out, _ = model(torch.randn(16, 8).to("spmd"))
    torchspmd.sync()
    assert get_sharding(out) == text_of((16, 4), mesh, ("fsdp", None))


def test_tuple_output_without_leading_tensor_raises():
    model = FSDPv2(TupleOut(first_is_tensor=False), mesh=fsdp_mesh())
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="The output type is not supported"):
        warnings.simplefilter("ignore")
        model(torch.randn(16, 8).to("spmd"))


def test_dict_output_raises():
    class DictOut(nn.Linear):
        def forward(self, x):
            return {"y": super().forward(x)}

    model = FSDPv2(DictOut(8, 4), mesh=fsdp_mesh())
    with pytest.raises(RuntimeError, match="The output type is not supported: <class 'dict'>"):
        model(torch.randn(16, 8).to("spmd"))


def test_custom_shard_output_is_called_with_output_and_mesh():
    calls = []
    mesh = fsdp_mesh()
    model = FSDPv2(nn.Linear(8, 4), mesh=mesh, shard_output=lambda o, m: calls.append((o, m)))
    out = model(torch.randn(16, 8).to("spmd"))
    assert len(calls) == 1 and calls[0][0] is out and calls[0][1] is mesh


# --- auto wrapping ---------------------------------------------------------------------

def test_auto_wrap_policy_wraps_the_chosen_children():
    def policy(module, recurse, unwrapped_params):
        return recurse or isinstance(module, nn.Linear)

    model = FSDPv2(TwoLayers(), mesh=fsdp_mesh(), auto_wrap_policy=policy)
    assert isinstance(model.module.fc1, FSDPv2) and isinstance(model.module.fc2, FSDPv2)
    assert not isinstance(model.module, FSDPv2)


def test_auto_wrap_keeps_a_weight_tied_across_a_wrapped_child():
    model = nn.Sequential(nn.Embedding(8, 16), nn.Linear(16, 8, bias=False))
    model[1].weight = model[0].weight

    def policy(module, recurse, unwrapped_params):
        return recurse or isinstance(module, nn.Embedding)

    wrapped = FSDPv2(model, mesh=fsdp_mesh(), auto_wrap_policy=policy)
    assert isinstance(wrapped[0], FSDPv2)
    assert wrapped[1].weight is wrapped[0].module.weight


def test_auto_wrap_accepts_pytorch_policy_signature():
    from functools import partial

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    policy = partial(size_based_auto_wrap_policy, min_num_params=300)
    model = FSDPv2(TwoLayers(), mesh=fsdp_mesh(), auto_wrap_policy=policy)
    # fc1 has 544 parameters, fc2 264: only fc1 is big enough to be its own unit.
    assert isinstance(model.module.fc1, FSDPv2) and not isinstance(model.module.fc2, FSDPv2)


def test_auto_wrapper_callable_is_used():
    wrapped = []

    def wrapper(module, **kwargs):
        wrapped.append(module)
        return FSDPv2(module, **kwargs)

    FSDPv2(TwoLayers(), mesh=fsdp_mesh(), auto_wrap_policy=lambda **kw: True,
           auto_wrapper_callable=wrapper)
    assert [type(m) for m in wrapped] == [nn.Linear, nn.Linear]


# --- training --------------------------------------------------------------------------

def _batches(steps=5):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 16, generator=gen), torch.randn(16, 8, generator=gen))
            for _ in range(steps)]


def _train(model: nn.Module, device: str, mesh: Mesh | None = None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for x, y in _batches():
        x, y = x.to(device), y.to(device)
        if mesh is not None:
            mark_sharding(x, mesh, ("fsdp", None))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device == "spmd":
            torchspmd.sync()
        losses.append(loss.item())
    return losses


def test_training_matches_cpu():
    torch.manual_seed(0)
    cpu_model = TwoLayers()
    mesh = mesh_4x2()
    model = FSDPv2(copy.deepcopy(cpu_model), mesh=mesh,
                   auto_wrap_policy=lambda module, recurse, unwrapped_params:
                   recurse or isinstance(module, nn.Linear))
    spmd_losses = _train(model, "spmd", mesh)
    np.testing.assert_allclose(spmd_losses, _train(cpu_model, "cpu"), rtol=1e-4)
