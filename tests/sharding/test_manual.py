"""Manual sharding: ops between enable and disable see local blocks (shard_map semantics)."""

import numpy as np
import pytest
import torch

import torchspmd as xs


def _mesh():
    return xs.Mesh(np.arange(8), (1, 8), ("x", "y"))


def test_enable_gives_local_block_shape_and_manual_spec():
    x = torch.randn(8, 8).to("spmd")
    local = xs.enable_manual_sharding(x, (0, 1), mesh=_mesh())
    assert local.shape == (8, 1)
    assert local.sharding_spec == "{manual}"


def test_per_shard_computation_round_trips_to_the_global_value():
    cpu = torch.randn(8, 16)
    x = cpu.to("spmd")
    local = xs.enable_manual_sharding(x, (None, "y"), mesh=_mesh())
    local = (local * 2).exp() + local.sum(dim=0, keepdim=True)  # per device, on (8, 2) blocks
    y = xs.disable_manual_sharding(local, (None, "y"), (8, 16), mesh=_mesh())
    blocks = [(b * 2).exp() + b.sum(dim=0, keepdim=True) for b in cpu.split(2, dim=1)]
    torch.testing.assert_close(y.cpu(), torch.cat(blocks, dim=1))


def test_global_mesh_is_the_default():
    xs.set_global_mesh(_mesh())
    try:
        x = torch.arange(16.0).reshape(2, 8).to("spmd")
        local = xs.enable_manual_sharding(x, (None, "y"))
        y = xs.disable_manual_sharding(local + 1, (None, "y"), (2, 8))
        torch.testing.assert_close(y.cpu(), torch.arange(16.0).reshape(2, 8) + 1)
    finally:
        xs.set_global_mesh(None)


def test_no_mesh_anywhere_is_an_error():
    with pytest.raises(ValueError, match="No mesh is provided"):
        xs.enable_manual_sharding(torch.ones(8).to("spmd"), (0,))


def test_reading_a_local_block_without_disable_is_an_error():
    local = xs.enable_manual_sharding(torch.ones(8, 8).to("spmd"), (0, 1), mesh=_mesh())
    with pytest.raises(RuntimeError, match="disable_manual_sharding"):
        (local + 1).cpu()


def test_marking_data_as_manual_is_refused():
    with pytest.raises(RuntimeError, match="Marking any data tensors as manual is not supported"):
        xs._mark_manual_sharding(torch.ones(4).to("spmd"))


def test_mark_manual_on_a_local_block_keeps_it_and_reports_manual():
    cpu = torch.randn(8, 16)
    local = xs.enable_manual_sharding(cpu.to("spmd"), (None, "y"), mesh=_mesh())
    marked = xs._mark_manual_sharding(local * 2)
    assert marked.sharding_spec == "{manual}" and marked.shape == (8, 2)
    y = xs.disable_manual_sharding(marked, (None, "y"), (8, 16), mesh=_mesh())
    torch.testing.assert_close(y.cpu(), cpu * 2)


def test_mark_manual_on_a_global_value_makes_each_device_hold_a_copy():
    # XLA reads {manual} on a replicated value as: every device's block is the whole value.
    cpu = torch.arange(4.0)
    local = xs._mark_manual_sharding(cpu.to("spmd") * 3, mesh=_mesh())
    assert local.sharding_spec == "{manual}" and local.shape == (4,)
    y = xs.disable_manual_sharding(local + 1, ("y",), (32,), mesh=_mesh())
    torch.testing.assert_close(y.cpu(), (cpu * 3 + 1).repeat(8))


def test_values_after_disable_are_no_longer_manual():
    local = xs.enable_manual_sharding(torch.ones(8, 8).to("spmd"), (0, 1), mesh=_mesh())
    y = xs.disable_manual_sharding(local, (0, 1), (8, 8), mesh=_mesh()) + 1
    assert xs.get_sharding(y) != "{manual}"


def test_mark_manual_without_any_mesh_is_an_error():
    with pytest.raises(ValueError, match="No mesh is provided"):
        xs._mark_manual_sharding(torch.ones(4).to("spmd") * 2)


def test_a_loop_keeping_its_local_block_alive_at_sync_computes_the_global_result():
    # `local` is still referenced at sync(): it stays pending (nobody read its value).
    cpu = torch.randn(16, 4)
    mesh = xs.Mesh(np.arange(8), (8,), ("a",))
    for i in range(3):
        x = cpu.to(xs.device())
        local = xs.enable_manual_sharding(x, ("a", None), mesh=mesh).global_tensor
        local = local * (i + 2)
        y = xs.disable_manual_sharding(local, ("a", None), cpu.shape, mesh=mesh).global_tensor
        xs.sync()
        torch.testing.assert_close(y.cpu(), cpu * (i + 2), rtol=0, atol=0)
        assert local.shape == (2, 4)


def test_a_local_block_kept_over_syncs_still_reassembles_to_its_value():
    cpu = torch.randn(16, 4)
    mesh = xs.Mesh(np.arange(8), (8,), ("a",))
    locals_, outputs = [], []
    for i in range(3):
        local = xs.enable_manual_sharding(cpu.to(xs.device()) + i, ("a", None),
                                          mesh=mesh).global_tensor.exp()
        locals_.append(local)
        outputs.append(xs.disable_manual_sharding(local, ("a", None), cpu.shape, mesh=mesh))
        xs.sync()
        torch.testing.assert_close(outputs[-1].cpu(), (cpu + i).exp())
    # Blocks of every iteration, kept pending all along, give their regions' values again.
    for i, local in enumerate(locals_):
        again = xs.disable_manual_sharding(local * 1, ("a", None), cpu.shape, mesh=mesh)
        torch.testing.assert_close(again.cpu(), (cpu + i).exp())


def test_reads_and_syncs_while_a_local_block_is_pending_work():
    cpu, other_cpu = torch.randn(8, 16), torch.randn(4)
    other = other_cpu.to(xs.device()) * 3
    local = xs.enable_manual_sharding(cpu.to(xs.device()), (None, "y"), mesh=_mesh()) * 2
    torch.testing.assert_close(other.sum().cpu(), (other_cpu * 3).sum())
    xs.sync()
    y = xs.disable_manual_sharding(local, (None, "y"), (8, 16), mesh=_mesh())
    torch.testing.assert_close(y.cpu(), cpu * 2)


def test_disable_with_another_spec_lays_each_block_at_its_mesh_position_under_that_spec():
    # PyTorch/XLA's shard_to_full takes the spec it is given (shard_map's out_specs may
    # differ from in_specs): blocks cut along dim 0 are laid side by side along dim 1.
    cpu = torch.arange(64.0).reshape(16, 4)
    mesh = xs.Mesh(np.arange(8), (8,), ("a",))
    local = xs.enable_manual_sharding(cpu.to(xs.device()), ("a", None), mesh=mesh)
    y = xs.disable_manual_sharding(local, (None, "a"), (2, 32), mesh=mesh)
    torch.testing.assert_close(y.cpu(), torch.cat(cpu.split(2), dim=1), rtol=0, atol=0)


def test_disable_with_swapped_axes_on_a_permuted_mesh_keeps_mesh_positions():
    cpu = torch.arange(48.0).reshape(8, 6)
    mesh = xs.Mesh([3, 6, 0, 5, 1, 7, 2, 4], (4, 2), ("a", "b"))
    local = xs.enable_manual_sharding(cpu.to(xs.device()), ("a", "b"), mesh=mesh)  # (2, 3)
    y = xs.disable_manual_sharding(local, ("b", "a"), (4, 12), mesh=mesh)
    expected = torch.zeros(4, 12)
    for i in range(4):  # the block at mesh position (i, j) is tile (j, i) under ("b", "a")
        for j in range(2):
            expected[2 * j:2 * j + 2, 3 * i:3 * i + 3] = cpu[2 * i:2 * i + 2, 3 * j:3 * j + 3]
    torch.testing.assert_close(y.cpu(), expected, rtol=0, atol=0)


def test_a_manual_region_inside_a_compiled_step_updates_state_like_cpu():
    # The state's layout after the first call (sharded, from the region) differs from the
    # one it was compiled for (replicated): the step is captured again, not sent to a
    # program that rejects it.
    mesh = xs.Mesh(np.arange(8), (8,), ("a",))
    w_cpu = torch.randn(16, 4)
    w = w_cpu.to(xs.device())

    @xs.compile
    def step(x):
        local = xs.enable_manual_sharding(x, ("a", None), mesh=mesh).global_tensor
        y = xs.disable_manual_sharding(local.exp() * 2, ("a", None), (16, 4),
                                       mesh=mesh).global_tensor
        w.add_(y)
        return y

    for _ in range(4):
        x_cpu = torch.randn(16, 4)
        y = step(x_cpu.to(xs.device()))
        w_cpu += x_cpu.exp() * 2
        torch.testing.assert_close(y.cpu(), x_cpu.exp() * 2)
    torch.testing.assert_close(w.cpu(), w_cpu)


def test_two_regions_in_one_graph_each_run_when_their_inputs_are_ready():
    """The second region's input is made after the first region ends (here an annotation
    of the same tensor); each region is its own shard_map, run in program order."""
    cpu = (torch.arange(40.) - 20).reshape(8, 5)
    x = cpu.to("spmd")
    mesh = xs.Mesh([7, 0, 2, 5], (4,))
    first = xs.enable_manual_sharding(x, (0, None), mesh=mesh).global_tensor
    y = xs.disable_manual_sharding(torch.relu(first), (0, None), (8, 5), mesh=mesh).global_tensor
    xs.annotate_custom_sharding(x, xs.Mesh([1, 6, 4, 3, 0, 5, 7, 2], (8,), ("a",)), ("a", None))
    second = xs.enable_manual_sharding(x, (0, None), mesh=mesh).global_tensor
    z = xs.disable_manual_sharding(second * 2, (0, None), (8, 5), mesh=mesh).global_tensor
    torch.testing.assert_close(y.cpu(), torch.relu(cpu))
    torch.testing.assert_close(z.cpu(), cpu * 2)
