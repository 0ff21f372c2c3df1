"""XLAShardedTensor: shards, loading shards, spec properties, dispatch, autograd (spec §1.8, §1.9, §4.6)."""

import copy

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import (Mesh, ShardingType, XLAShard, XLAShardedTensor, get_sharding,
                                mark_sharding, wrap_as_sharded_tensor)

N = 8


def sharded(cpu: torch.Tensor, mesh_shape, spec, names=None) -> XLAShardedTensor:
    return mark_sharding(cpu.to("spmd"), Mesh(np.arange(N), mesh_shape, names), spec)


def test_local_shards_of_tiled_tensor():
    cpu = torch.arange(64.0).reshape(8, 8)
    shards = sharded(cpu, (2, 4), (0, 1)).local_shards
    assert [s.shard_device for s in shards] == [f"CPU:{i}" for i in range(N)]
    assert shards[5].indices == [slice(4, 8, 1), slice(2, 4, 1)]
    assert all(s.replica_id == 0 for s in shards)
    torch.testing.assert_close(shards[5].data, cpu[4:8, 2:4])


def test_local_shards_of_partial_tensor_have_replica_ids():
    cpu = torch.randn(16, 16)
    shards = sharded(cpu, (4, 2), (None, 1)).local_shards
    assert [s.replica_id for s in shards] == [i // 2 for i in range(N)]  # spec §2
    assert shards[1].indices == [slice(0, 16, 1), slice(8, 16, 1)]
    torch.testing.assert_close(shards[1].data, cpu[:, 8:])


def test_local_shards_of_replicated_tensor():
    cpu = torch.randn(4, 4)
    shards = sharded(cpu, (2, 4), (None, None)).local_shards
    assert [s.replica_id for s in shards] == list(range(N))
    assert all(s.indices is Ellipsis for s in shards)
    torch.testing.assert_close(shards[7].data, cpu)


def test_local_shards_of_unsharded_tensor_raise():
    with pytest.raises(RuntimeError, match="Tensor is not sharded"):
        XLAShardedTensor(torch.randn(4).to("spmd")).local_shards


def test_local_shards_run_pending_work():
    cpu = torch.randn(8, 8)
    y = cpu.to("spmd") * 3
    xst = mark_sharding(y, Mesh(np.arange(N), (2, 4)), (0, 1))
    torch.testing.assert_close(xst.local_shards[0].data, cpu[:4, :2] * 3)


def test_uneven_shards_are_padded_with_clamped_indices():
    shards = sharded(torch.arange(9.0), (N,), (0,)).local_shards  # spec §4.6
    assert all(s.data.shape == (2,) for s in shards)
    assert shards[4].indices == [slice(8, 9, 1)]
    torch.testing.assert_close(shards[4].data, torch.tensor([8.0, 0.0]))
    torch.testing.assert_close(shards[4].unpadded_data, torch.tensor([8.0]))
    assert shards[6].indices == [slice(9, 9, 1)] and shards[6].unpadded_data.numel() == 0


def test_uneven_annotation_of_computed_value_survives_sync():
    y = torch.arange(9.0).to("spmd") * 2
    xst = mark_sharding(y, Mesh(np.arange(N), (N,)), (0,))
    torchspmd.sync()  # XLA returns uneven outputs gathered; the annotation stays
    assert xst.sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(xst.local_shards[4].data, torch.tensor([16.0, 0.0]))


def test_uneven_2d_shards():
    shards = sharded(torch.randn(3, 5), (2, 4), (0, 1)).local_shards
    assert all(s.data.shape == (2, 2) for s in shards)
    assert shards[3].indices == [slice(0, 2, 1), slice(5, 5, 1)]


def test_unpadded_data_setter_writes_the_real_part():
    shard = XLAShard(torch.zeros(2), [slice(8, 9, 1)], "CPU:4", 0)
    shard.unpadded_data = torch.tensor([5.0])
    torch.testing.assert_close(shard.data, torch.tensor([5.0, 0.0]))


def test_load_local_shards_replaces_data_and_keeps_sharding():
    cpu = torch.randn(8, 8)
    xst = sharded(cpu, (2, 4), (0, 1))
    text = xst.sharding_spec
    xst.load_local_shards_([XLAShard(s.data * 2, s.indices, s.shard_device, s.replica_id)
                            for s in xst.local_shards])
    assert xst.sharding_spec == text
    torch.testing.assert_close(xst.global_tensor.cpu(), cpu * 2)


def test_load_local_shards_uneven_roundtrip():
    cpu = torch.arange(9.0)
    xst = sharded(cpu, (N,), (0,))
    xst.load_local_shards_(xst.local_shards)
    torch.testing.assert_close(xst.global_tensor.cpu(), cpu)


def test_load_local_shards_into_unsharded_tensor_raises():
    xst = XLAShardedTensor(torch.randn(4).to("spmd"))
    with pytest.raises(RuntimeError, match="Cannot load local shards into a non sharded tensor"):
        xst.load_local_shards_([])


def test_load_local_shards_needs_every_device():
    xst = sharded(torch.randn(8), (N,), (0,))
    with pytest.raises(RuntimeError, match="Shards must be provided for all local devices"):
        xst.load_local_shards_(xst.local_shards[:4])


def test_load_local_shards_into_replicated_tensor_raises():
    xst = sharded(torch.randn(8), (N,), (None,))
    with pytest.raises(RuntimeError, match="Replicated tensor should not be loaded"):
        xst.load_local_shards_(xst.local_shards)


def test_load_local_shards_needs_padding():
    xst = sharded(torch.arange(9.0), (N,), (0,))
    shards = [XLAShard(s.unpadded_data, s.indices, s.shard_device, 0) for s in xst.local_shards]
    with pytest.raises(RuntimeError, match=r"Input shard shape must include padding: \[1\] vs 2"):
        xst.load_local_shards_(shards)


@pytest.mark.parametrize("mesh_shape, spec, kind", [
    ((2, 4), (0, 1), ShardingType.TILED),
    ((2, 4), (0, None), ShardingType.PARTIAL),
    ((2, 4), (None, None), ShardingType.REPLICATED),
    ((1, 8), (None, 1), ShardingType.TILED),
    ((1, 8), (0, None), ShardingType.REPLICATED),
])
def test_sharding_type(mesh_shape, spec, kind):
    assert sharded(torch.randn(8, 8), mesh_shape, spec).sharding_type is kind


def test_sharding_type_of_unsharded_tensor_raises():
    with pytest.raises(ValueError, match="None is not a valid ShardingType"):
        XLAShardedTensor(torch.randn(4).to("spmd")).sharding_type


def test_op_results_are_wrappers_without_mesh_or_spec():
    xst = sharded(torch.randn(8, 8), (2, 4), (0, 1))
    y = xst + 1
    assert isinstance(y, XLAShardedTensor)
    assert y.mesh_shape is None and y.partition_spec is None


def test_mixed_argument_order_reaches_the_wrapper():
    cpu_a, cpu_b = torch.randn(8, 8), torch.randn(8, 8)
    xst = sharded(cpu_a, (2, 4), (0, 1))
    plain = cpu_b.to("spmd")
    assert isinstance(plain @ xst, XLAShardedTensor)
    torch.testing.assert_close((plain @ xst).cpu(), cpu_b @ cpu_a, rtol=1e-5, atol=1e-5)


def test_inplace_op_returns_the_same_wrapper():
    cpu = torch.randn(8, 8)
    xst = sharded(cpu, (2, 4), (0, 1))
    assert xst.add_(1) is xst
    torch.testing.assert_close(xst.cpu(), cpu + 1)


def test_cpu_returns_the_full_unpadded_tensor():
    cpu = torch.randn(3, 5)
    out = sharded(cpu, (2, 4), (0, 1)).cpu()
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, cpu)


def test_repr_shows_global_value():
    xst = XLAShardedTensor(torch.tensor([1.0, 2.0]).to("spmd"))
    assert repr(xst).startswith("XLAShardedTensor(tensor([1., 2.]")


def test_module_accepts_a_sharded_input():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(cpu_model).to("spmd")
    mesh = Mesh(np.arange(N), (2, 4))
    for p in model.parameters():  # on the input's mesh (see test_mark_sharding's xfail)
        mark_sharding(p, mesh, (None,) * p.dim())
    inp = torch.randn(8, 8)
    out = model(mark_sharding(inp.to("spmd"), mesh, (0, None)))
    torch.testing.assert_close(out.cpu(), cpu_model(inp), rtol=1e-5, atol=1e-5)


def test_backward_through_a_requires_grad_wrapper():
    cpu = torch.randn(4, 4)
    xst = XLAShardedTensor(cpu.to("spmd"), requires_grad=True)
    (xst * xst).sum().backward()
    assert xst.grad is not None
    torch.testing.assert_close(xst.grad.cpu(), 2 * cpu)


def test_global_tensor_is_detached_when_requires_grad():
    x = torch.randn(4).to("spmd").requires_grad_()
    xst = XLAShardedTensor(x, requires_grad=True)
    assert xst.requires_grad and not xst.global_tensor.requires_grad


def test_optimizer_steps_a_wrapper_parameter():
    cpu = torch.randn(8, 8)
    xst = XLAShardedTensor(cpu.to("spmd"), requires_grad=True)
    opt = torch.optim.SGD([xst], lr=0.5)
    (xst * xst).sum().backward()
    opt.step()
    torch.testing.assert_close(xst.cpu(), cpu - 0.5 * 2 * cpu)


def test_wrap_as_sharded_tensor_updates_an_existing_wrapper():
    xst = XLAShardedTensor(torch.randn(8, 8).to("spmd"))
    assert wrap_as_sharded_tensor(xst, (2, 4), (0, 1)) is xst
    assert xst.mesh_shape == (2, 4) and xst.partition_spec == (0, 1)


def test_deepcopy_of_wrapper_keeps_mesh_spec_and_sharding():
    cpu = torch.randn(8, 8)
    xst = sharded(cpu, (2, 4), (0, 1))
    dup = copy.deepcopy(xst)
    torchspmd.sync()
    assert dup.partition_spec == (0, 1)
    assert get_sharding(dup) == xst.sharding_spec
    torch.testing.assert_close(dup.cpu(), cpu)


@pytest.mark.parametrize("spec, expected", [
    (("tp", None), ("Replicate()", "Shard(dim=0)")),
    ((1, 0), ("Shard(dim=1)", "Shard(dim=0)")),
    ((("dp", "tp"), None), ("Shard(dim=0)", "Shard(dim=0)")),
], ids=["an axis name", "mesh dims by index", "a dim over two axes"])
def test_placements_are_dtensors_view_of_the_partition_spec(spec, expected):
    mesh = Mesh(np.arange(8), (2, 4), ("dp", "tp"))
    wrapped = mark_sharding(torch.ones(4, 8).to("spmd"), mesh, spec)
    assert tuple(repr(p) for p in wrapped.placements) == expected
    wrapped.invalidate_spec_cache()
    assert tuple(repr(p) for p in wrapped.placements) == expected


def test_placements_without_a_partition_spec_say_how_to_get_one():
    with pytest.raises(ValueError, match="Placements not available.*mark_sharding"):
        XLAShardedTensor(torch.ones(2).to("spmd")).placements
