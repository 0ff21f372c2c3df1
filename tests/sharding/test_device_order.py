"""Meshes over devices in any order (docs/concepts/rules.md): placement compares device sets.

A program runs over its devices in id order; a permuted mesh's layout is re-expressed over
that order without moving data, so tensors on meshes that order the same devices
differently mix with each other and with unsharded tensors, and each device keeps the
block its mesh gives it.
"""

from __future__ import annotations

import torch

import torchspmd
from tests.submesh import devices_of
from torchspmd.sharding import (HybridMesh, Mesh, annotate_custom_sharding, clear_sharding,
                                get_sharding, mark_sharding)

DEV = torchspmd.device()
SWAPPED = Mesh([1, 0, 2, 3, 4, 5, 6, 7], (8,), ("x",))
REVERSED = Mesh(list(range(7, -1, -1)), (4, 2), ("a", "b"))
HALF = Mesh([3, 1, 2, 0], (2, 2), ("a", "b"))


def test_permuted_mesh_and_unsharded_tensor_in_one_op_match_cpu():
    x = torch.arange(16.).to(DEV)
    mark_sharding(x, SWAPPED, ("x",))
    y = x + torch.ones(16).to(DEV)
    torch.testing.assert_close(y.cpu(), torch.arange(16.) + 1)


def test_two_orders_of_the_same_devices_in_one_op_match_cpu():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    x, y = a.to(DEV), b.to(DEV)
    mark_sharding(x, REVERSED, ("a", "b"))
    mark_sharding(y, SWAPPED, ("x", None))
    torch.testing.assert_close((x @ y).cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_pending_constraints_of_two_orders_in_one_graph_match_cpu():
    a = torch.randn(8, 8)
    x = a.to(DEV) * 2
    mark_sharding(x, REVERSED, (None, "a"))
    y = x.t() * 3
    mark_sharding(y, SWAPPED, ("x", None))
    torch.testing.assert_close((x + y).cpu(), a * 2 + a.t() * 6)


def test_marking_computed_synced_data_onto_a_permuted_mesh_moves_it_there():
    x = torch.arange(16., device=DEV) * 2
    torchspmd.sync()
    xst = mark_sharding(x, SWAPPED, ("x",))
    assert get_sharding(x) == "{devices=[8]1,0,2,3,4,5,6,7}"
    shards = {s.shard_device: s for s in xst.local_shards}
    assert shards["CPU:1"].indices == [slice(0, 2, 1)] and shards["CPU:1"].data.tolist() == [0, 2]
    assert shards["CPU:0"].data.tolist() == [4, 6]
    torch.testing.assert_close(x.sum().cpu(), torch.tensor(240.))


def test_resharding_between_two_orders_keeps_values_and_blocks():
    x = torch.arange(64.).reshape(8, 8).to(DEV)
    mark_sharding(x, REVERSED, ("a", "b"))
    (x + 0).cpu()
    clear_sharding(x)
    xst = mark_sharding(x, SWAPPED, (None, "x"))
    shard = next(s for s in xst.local_shards if s.shard_device == "CPU:1")
    assert shard.indices == [slice(0, 8, 1), slice(0, 1, 1)]
    torch.testing.assert_close(x.cpu(), torch.arange(64.).reshape(8, 8))


def test_annotate_custom_sharding_onto_another_order_matches_cpu():
    x = torch.arange(64.).reshape(8, 8).to(DEV)
    mark_sharding(x, REVERSED, ("a", "b"))
    annotate_custom_sharding(x, SWAPPED, ("x", None))
    y = x * 2
    torchspmd.sync()
    assert get_sharding(x) == "{devices=[8,1]1,0,2,3,4,5,6,7}"
    torch.testing.assert_close(y.cpu(), torch.arange(64.).reshape(8, 8) * 2)


def test_permuted_sub_mesh_and_unsharded_tensor_match_cpu():
    x = torch.arange(16.).reshape(4, 4).to(DEV)
    mark_sharding(x, HALF, ("a", "b"))
    z = (x @ torch.eye(4).to(DEV)) + 1
    torch.testing.assert_close(z.cpu(), torch.arange(16.).reshape(4, 4) + 1)
    assert devices_of(z) == {0, 1, 2, 3}


def test_hybrid_mesh_mixes_with_a_permuted_mesh():
    hybrid = HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model"))
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    a, b = x.to(DEV), y.to(DEV)
    mark_sharding(a, hybrid, ("data", "model"))
    mark_sharding(b, SWAPPED, (None, "x"))
    torch.testing.assert_close((a * b).sum(0).cpu(), (x * y).sum(0))


def test_training_on_a_permuted_mesh_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    model = torch.nn.Linear(8, 4).to(DEV)
    model.load_state_dict(cpu.state_dict())
    mark_sharding(model.weight, SWAPPED, (None, "x"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, model)]
    data = torch.randn(16, 8)
    for m, opt, x in zip((cpu, model), opts, (data, data.to(DEV))):
        for _ in range(2):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    torch.testing.assert_close(model.weight.cpu(), cpu.weight, rtol=1e-5, atol=1e-6)


UNORDERED = Mesh([1, 4, 6, 0, 7, 2, 3, 5], (2, 4), ("a", "b"))
UNORDERED_PARTIAL = "{devices=[4,2]1,7,2,4,3,6,0,5 last_tile_dim_replicate}"


def test_partial_replication_lists_each_replica_group_in_ascending_id():
    # PyTorch/XLA's string for this mesh and spec (issue 11 §4): groups {1,7}, {4,2}->{2,4}...
    x = torch.arange(16.).to(DEV)
    assert mark_sharding(x, UNORDERED, ("b",)).sharding_spec == UNORDERED_PARTIAL


def test_partial_replication_of_a_computed_value_reports_the_same_string():
    x = torch.arange(16., device=DEV) * 1
    mark_sharding(x, UNORDERED, ("b",))
    torchspmd.sync()
    assert get_sharding(x) == UNORDERED_PARTIAL


def test_replica_id_is_the_position_in_the_ascending_group():
    xst = mark_sharding(torch.arange(16.).to(DEV), UNORDERED, ("b",))
    replica = {s.shard_device: s.replica_id for s in xst.local_shards}
    assert replica == {"CPU:1": 0, "CPU:7": 1, "CPU:2": 0, "CPU:4": 1,
                       "CPU:3": 0, "CPU:6": 1, "CPU:0": 0, "CPU:5": 1}


def test_each_device_reports_the_tile_the_partial_string_gives_it():
    cpu = torch.arange(16.)
    x = cpu.to(DEV)
    xst = mark_sharding(x, UNORDERED, ("b",))
    (x + 0).cpu()  # uploads x
    node, i = x.handle.value()
    array = node.arrays[i]
    for shard in xst.local_shards:
        assert torch.equal(shard.data, cpu[tuple(shard.indices)])
    # The devices' own buffers (what XLA computes with) hold the tiles of the same spec
    # over the mesh in id order: XLA miscompiles other tile orders (xla_shardings).
    in_id_order = Mesh(sorted(UNORDERED.device_ids), (2, 4), ("a", "b"))
    held = {s.device.id: s.data.tolist() for s in array.addressable_shards}
    expected = {s.shard_device: s.data.tolist()
                for s in mark_sharding(cpu.to(DEV), in_id_order, ("b",)).local_shards}
    assert {f"CPU:{d}": data for d, data in held.items()} == expected
