"""mark_sharding on real spmd tensors: sharding text, upload bytes, data paths (spec §1.5, §2, §4.2)."""

import copy

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import (Mesh, XLAShardedTensor, clear_sharding, get_sharding,
                                mark_sharding, wrap_if_sharded)

N = 8
TILED_2x4 = "{devices=[2,4]0,1,2,3,4,5,6,7}"
PARTIAL_2x4 = "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"


def mesh_2x4(names=None) -> Mesh:
    return Mesh(np.arange(N), (2, 4), names)


def device_data(cpu: torch.Tensor) -> torch.Tensor:
    """``cpu`` on the spmd device as uploaded (replicated) device data."""
    x = cpu.to("spmd")
    (x + 0).cpu()  # running a graph that reads x uploads its leaf
    assert x.handle.value()[0].arrays is not None
    return x


def is_pending(t: torch.Tensor) -> bool:
    return not t.handle.value()[0].is_leaf


# spec §2 worked examples: (mesh shape, axis names, device ids, tensor shape, spec, text)
WORKED = {
    "mark_sharding_2d": ((1, 8), None, None, (1, 128), (0, 1), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    "custom_tile_assignment": ((1, 8), None, list(range(7, -1, -1)), (10, 20), (0, 1),
                               "{devices=[1,8]7,6,5,4,3,2,1,0}"),
    "tupled_partition_spec": ((2, 4), None, None, (16,), ((0, 1),), "{devices=[8]0,1,2,3,4,5,6,7}"),
    "named_partial_tupled_rb": ((1, 2, 4), ("r", "b", "m"), None, (16, 16), (("r", "b"), None),
                                "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    "named_partial_tupled_bm": ((1, 2, 4), ("r", "b", "m"), None, (16, 16), (None, ("b", "m")),
                                "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    "named_partial_tupled_rm": ((1, 2, 4), ("r", "b", "m"), None, (16, 16), (None, ("r", "m")),
                                "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    "named_partial_tupled_mb": ((1, 2, 4), ("r", "b", "m"), None, (16, 16), (None, ("m", "b")),
                                "{devices=[1,8]0,4,1,5,2,6,3,7}"),
    "multiple_tuples": ((1, 2, 4, 1), ("a", "b", "c", "d"), None, (2, 2), (("a", "b"), ("c", "d")),
                        "{devices=[2,4]0,1,2,3,4,5,6,7}"),
    "3d_tensor_2d_mesh": ((2, 4), None, None, (16, 16, 16), (None, 0, 1),
                          "{devices=[1,2,4]0,1,2,3,4,5,6,7}"),
    "mark_sharding_partial": ((2, 4), None, None, (4, 4), (0, None), PARTIAL_2x4),
    "partial_unordered": ((2, 1, 4), None, None, (4, 3, 4), (1, None, 0),
                          "{devices=[1,1,2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    "2d_tensor_3d_mesh": ((2, 4, 1), None, None, (16, 16), (2, 1),
                          "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    "partially_replicated_xla_shards": ((4, 2), None, None, (16, 16), (None, 1),
                                        "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    "fsdp_v2_multi_slice": ((2, 4, 1), ("data", "fsdp", "tensor"), None, (8, 16), (None, "fsdp"),
                            "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    "mark_shard_scalar": ((2, 4), None, None, (), (), "{replicated}"),
}


def _worked(name):
    shape, names, ids, tshape, spec, text = WORKED[name]
    mesh = Mesh(np.arange(N) if ids is None else ids, shape, names)
    cpu = torch.randn(tshape)
    return mesh, cpu, spec, text


@pytest.mark.parametrize("name", list(WORKED))
def test_worked_example_sharding_spec(name):
    mesh, cpu, spec, text = _worked(name)
    xst = mark_sharding(cpu.to("spmd"), mesh, spec)
    assert xst.sharding_spec == text


@pytest.mark.parametrize("name", list(WORKED))
def test_worked_example_values_match_cpu(name):
    mesh, cpu, spec, text = _worked(name)
    x = cpu.to("spmd")
    mark_sharding(x, mesh, spec)
    torch.testing.assert_close((x * 2 + 1).cpu(), cpu * 2 + 1)
    assert get_sharding(x) == text  # the upload kept the annotation


def test_returns_wrapper_around_same_tensor():
    x = torch.randn(8, 8).to("spmd")
    xst = mark_sharding(x, mesh_2x4(), (0, 1))
    assert isinstance(xst, XLAShardedTensor)
    assert xst.global_tensor is x
    assert xst.mesh_shape == (2, 4) and xst.partition_spec == (0, 1)


def test_rank_mismatch_raises_reference_message():
    with pytest.raises(AssertionError, match=r"Partition spec length \(1\) should be equal "
                                             r"to the input rank \(2\)\."):
        mark_sharding(torch.randn(8, 8).to("spmd"), mesh_2x4(), (0,))


def test_cpu_tensor_is_rejected():
    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        mark_sharding(torch.randn(8, 8), mesh_2x4(), (0, 1))


def test_host_data_upload_sends_only_the_shards():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, mesh_2x4(), (0, 1))
    torchspmd.reset_metrics()
    (x + 1).cpu()
    assert torchspmd.metrics()["bytes_to_device"] == 8 * 8 * 4  # spec §4.1: 256 B


def test_host_data_partial_upload_sends_one_copy_per_replica():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, mesh_2x4(), (0, None))
    torchspmd.reset_metrics()
    (x + 1).cpu()
    assert torchspmd.metrics()["bytes_to_device"] == 4 * (8 * 8 * 4)  # 4 replicas of each half


def test_pending_value_gets_constraint_without_running():
    x = torch.randn(8, 8).to("spmd")
    y = x + 1
    runs = torchspmd.metrics()["executions"]
    mark_sharding(y, mesh_2x4(), (0, 1))
    assert get_sharding(y) == TILED_2x4
    assert is_pending(y) and torchspmd.metrics()["executions"] == runs


def test_pending_value_keeps_sharding_after_sync():
    cpu = torch.randn(8, 8)
    y = cpu.to("spmd") + 1
    mark_sharding(y, mesh_2x4(), (0, 1))
    torchspmd.sync()
    assert get_sharding(y) == TILED_2x4
    torch.testing.assert_close(y.cpu(), cpu + 1)


def test_pending_value_can_be_marked_again():
    y = torch.randn(8, 8).to("spmd") * 3
    mark_sharding(y, mesh_2x4(), (0, 1))
    mark_sharding(y, mesh_2x4(), (0, None))
    assert get_sharding(y) == PARTIAL_2x4


def test_device_data_is_resharded():
    cpu = torch.randn(8, 8)
    x = device_data(cpu)
    mark_sharding(x, mesh_2x4(), (0, 1))
    node = x.handle.value()[0]
    assert node.is_leaf and len(node.arrays[0].addressable_shards[0].data.shape) == 2
    assert node.arrays[0].addressable_shards[0].data.shape == (4, 2)
    torch.testing.assert_close(x.cpu(), cpu)


def test_different_spec_on_annotated_device_data_raises():
    x = device_data(torch.randn(8, 8))
    mark_sharding(x, mesh_2x4(), (0, 1))
    with pytest.raises(RuntimeError, match="Existing annotation must be cleared first"):
        mark_sharding(x, mesh_2x4(), (1, 0))


def test_same_spec_again_is_a_noop():
    x = device_data(torch.randn(8, 8))
    mark_sharding(x, mesh_2x4(), (0, 1))
    leaf = x.handle.value()[0]
    mark_sharding(x, mesh_2x4(), (0, 1))
    assert x.handle.value()[0] is leaf


def test_replicated_device_data_may_become_tiled():
    x = device_data(torch.randn(8, 8))
    mark_sharding(x, mesh_2x4(), (None, None))
    assert get_sharding(x) == "{replicated}"
    mark_sharding(x, mesh_2x4(), (0, 1))
    assert get_sharding(x) == TILED_2x4


def test_marking_a_sharded_tensor_annotates_its_global_tensor():
    x = torch.randn(8, 8).to("spmd")
    xst = XLAShardedTensor(x)
    assert mark_sharding(xst, mesh_2x4(), (0, 1)) is xst
    assert get_sharding(x) == TILED_2x4


def test_parameter_of_a_module_is_marked_in_place():
    cpu = torch.nn.Linear(8, 16)
    lin = copy.deepcopy(cpu).to("spmd")
    mark_sharding(lin.weight, mesh_2x4(), (1, None))
    assert isinstance(lin.weight, torch.nn.Parameter)
    inp = torch.randn(4, 8)
    torch.testing.assert_close(lin(inp.to("spmd")).cpu(), cpu(inp), rtol=1e-5, atol=1e-5)
    assert get_sharding(lin.weight) == "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"


def test_get_sharding_of_plain_data_is_empty():
    assert get_sharding(torch.randn(4).to("spmd")) == ""
    assert get_sharding(device_data(torch.randn(4))) == ""


def test_op_result_is_unsharded_until_sync_then_carries_xla_choice():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, Mesh(np.arange(N), (1, 8)), (0, 1))
    y = x + 1
    assert get_sharding(y) == ""
    torchspmd.sync()
    assert get_sharding(y) == "{devices=[1,8]0,1,2,3,4,5,6,7}"  # spec §4.3


def test_clear_sharding_returns_plain_tensor_and_keeps_values():
    cpu = torch.randn(8, 8)
    x = device_data(cpu)
    xst = mark_sharding(x, mesh_2x4(), (0, 1))
    plain = clear_sharding(xst)
    assert plain is x and not isinstance(plain, XLAShardedTensor)
    assert get_sharding(x) == "" and xst.sharding_spec == ""
    torch.testing.assert_close(x.cpu(), cpu)


def test_clear_sharding_allows_another_spec():
    x = device_data(torch.randn(8, 8))
    mark_sharding(x, mesh_2x4(), (0, 1))
    clear_sharding(x)
    mark_sharding(x, mesh_2x4(), (0, None))
    assert get_sharding(x) == PARTIAL_2x4


def test_clear_sharding_of_pending_value_drops_constraint():
    y = torch.randn(8, 8).to("spmd") + 1
    mark_sharding(y, mesh_2x4(), (0, 1))
    clear_sharding(y)
    assert get_sharding(y) == ""


def _sharded_after_sync(cpu):
    x = cpu.to("spmd")
    mark_sharding(x, mesh_2x4(), (0, 1))
    return x


def test_clone_keeps_sharding():
    cpu = torch.randn(8, 8)
    y = _sharded_after_sync(cpu).clone()
    torchspmd.sync()
    assert get_sharding(y) == TILED_2x4
    torch.testing.assert_close(y.cpu(), cpu)


def test_deepcopy_keeps_sharding():
    cpu = torch.randn(8, 8)
    y = copy.deepcopy(_sharded_after_sync(cpu))
    torchspmd.sync()
    assert get_sharding(y) == TILED_2x4
    torch.testing.assert_close(y.cpu(), cpu)


def test_inplace_add_keeps_sharding():
    cpu = torch.randn(8, 8)
    x = _sharded_after_sync(cpu)
    x.add_(1)
    torchspmd.sync()
    assert get_sharding(x) == TILED_2x4
    torch.testing.assert_close(x.cpu(), cpu + 1)


def test_uneven_dim_keeps_annotation_and_values():
    cpu = torch.arange(9.0)
    x = cpu.to("spmd")
    mark_sharding(x, Mesh(np.arange(N), (N,)), (0,))
    assert get_sharding(x) == "{devices=[8]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close((x * 2).cpu(), cpu * 2)


def test_sub_mesh_text_uses_real_device_ids():
    x = torch.randn(4, 4).to("spmd")
    mark_sharding(x, Mesh([2, 3], (1, 2), ("x", "y")), ("x", "y"))
    assert get_sharding(x) == "{devices=[1,2]2,3}"


def test_wrap_if_sharded_wraps_only_sharded_spmd_tensors():
    plain = torch.randn(8, 8).to("spmd")
    sharded = torch.randn(8, 8).to("spmd")
    mark_sharding(sharded, mesh_2x4(), (0, 1))
    assert wrap_if_sharded(plain) is plain
    assert isinstance(wrap_if_sharded(sharded), XLAShardedTensor)
    assert wrap_if_sharded(3) == 3


def test_unannotated_data_combines_with_sharded_data():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    error = None
    try:
        x = b.to("spmd")
        mark_sharding(x, mesh_2x4(), (0, None))
        torch.testing.assert_close((a.to("spmd") + x).cpu(), a + b)
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    # Raised outside the handler: a kept traceback would keep the failed graph pending,
    # and every later sync() in this process would run it again.
    assert error is None, error


def test_inplace_op_keeps_target_sharding_against_other_operand():
    x, y = torch.randn(8, 8).to("spmd"), torch.randn(8, 8).to("spmd")
    mark_sharding(x, mesh_2x4(), (1, 0))
    mark_sharding(y, mesh_2x4(), (0, 1))
    x.mul_(y)
    torchspmd.sync()
    assert get_sharding(x) == "{devices=[4,2]0,4,1,5,2,6,3,7}"
