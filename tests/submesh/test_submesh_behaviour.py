"""Sub-meshes end to end (DESIGN "Sub-meshes"; spec §4.7): where data and programs live.

A mesh may name any subset of the devices, in any order. Its shardings and shards show
the real device ids; a computation on it runs on its devices only; unsharded data lends
the buffers it already has there; two sub-meshes live side by side; one computation
that mixes two device sets is refused with an error that says how to fix it.
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd
from tests.submesh import _no_pending_work_from_earlier_tests, devices_of  # noqa: F401
from torchspmd.runtime.placement import MeshMismatchError
from torchspmd.sharding import (Mesh, annotate_custom_sharding, clear_sharding, get_sharding,
                                mark_sharding)
from torchspmd.testing.models import MLP, adamw_reference_losses

N = 8
ALL = set(range(N))
A = Mesh([0, 1, 2, 3], (2, 2), ("x", "y"))  # two halves of the devices
B = Mesh([7, 6, 5, 4], (2, 2), ("x", "y"))  # (reversed order, to keep ids honest)


def ids(mesh: Mesh) -> set[int]:
    return set(mesh.device_ids.tolist())


def on_device(cpu: torch.Tensor) -> torch.Tensor:
    """``cpu`` as unsharded data already on (all) the devices."""
    x = cpu.to("spmd")
    (x + 0).cpu()
    assert devices_of(x) == ALL
    return x


# --- meshes of any shape over any subset: what the sharding API reports --------------

# id -> (device ids, mesh shape, partition spec of a 12x12 tensor, expected V1 text)
REPORTED = {
    "ids2-3_1x2": ([2, 3], (1, 2), ("x", "y"), "{devices=[1,2]2,3}"),
    "ids3-1_reversed": ([3, 1], (1, 2), ("x", "y"), "{devices=[1,2]3,1}"),
    "ids4-7_2x2": ([4, 5, 6, 7], (2, 2), ("x", "y"), "{devices=[2,2]4,5,6,7}"),
    "ids1-5-3-7_scattered": ([1, 5, 3, 7], (2, 2), ("x", "y"), "{devices=[2,2]1,5,3,7}"),
    "ids4-7_partial": ([4, 5, 6, 7], (2, 2), ("x", None),
                       "{devices=[2,1,2]4,5,6,7 last_tile_dim_replicate}"),
    "ids7-2_3x2_transposed": ([7, 6, 5, 4, 3, 2], (3, 2), ("y", "x"),
                              "{devices=[2,3]7,5,3,6,4,2}"),
    "ids5-0-2_1d": ([5, 0, 2], (3,), ("x", None), "{devices=[3,1]5,0,2}"),
    "ids6_one_device": ([6], (1,), ("x", None), "{replicated}"),
}


def _names(shape):
    return ("x", "y")[:len(shape)]


@pytest.mark.parametrize("case", list(REPORTED))
def test_sharding_text_shards_and_data_show_the_real_devices(case):
    device_ids, shape, spec, text = REPORTED[case]
    mesh = Mesh(device_ids, shape, _names(shape))
    cpu = torch.randn(12, 12)
    x = cpu.to("spmd")
    xst = mark_sharding(x, mesh, spec)
    assert xst.sharding_spec == text and get_sharding(x) == text
    shards = xst.local_shards
    assert [s.shard_device for s in shards] == [f"CPU:{i}" for i in sorted(device_ids)]
    for shard in shards:
        index = Ellipsis if shard.indices is Ellipsis else tuple(shard.indices)
        torch.testing.assert_close(shard.unpadded_data, cpu[index])
    assert devices_of(x) == set(device_ids)
    y = x * 2
    torch.testing.assert_close(y.cpu(), cpu * 2)
    assert devices_of(y) == set(device_ids)


def test_replicated_on_a_sub_mesh_keeps_one_copy_per_mesh_device():
    mesh = Mesh([3, 1], (1, 2), ("x", "y"))
    cpu = torch.randn(4, 4)
    xst = mark_sharding(cpu.to("spmd"), mesh, ("x", None))  # 'x' has size 1: replicated
    assert xst.sharding_spec == "{replicated}"
    shards = xst.local_shards
    assert [s.shard_device for s in shards] == ["CPU:1", "CPU:3"]
    for shard in shards:
        assert shard.indices is Ellipsis
        torch.testing.assert_close(shard.data, cpu)


@pytest.mark.parametrize("made_by", ["upload", "computation"])
def test_marking_device_data_replicated_on_a_sub_mesh_moves_it_there(made_by):
    """'{replicated}' on all devices and on a sub-mesh read alike; the devices differ."""
    cpu = torch.randn(4, 4)
    x = on_device(cpu)
    if made_by == "computation":
        x = x * 1
        torchspmd.sync()
        assert devices_of(x) == ALL
    mark_sharding(x, Mesh([2, 3], (1, 2), ("x", "y")), ("x", None))
    assert devices_of(x) == {2, 3}
    y = x + 1
    torch.testing.assert_close(y.cpu(), cpu + 1)
    assert devices_of(y) == {2, 3}


# --- a sub-mesh computation runs on the sub-mesh only ------------------------------

def test_every_output_of_a_sub_mesh_computation_lives_on_the_sub_mesh():
    w_cpu, x_cpu = torch.randn(8, 8), torch.randn(8, 8)
    w, x = w_cpu.to("spmd"), x_cpu.to("spmd")
    mark_sharding(w, B, ("x", "y"))
    mark_sharding(x, B, ("x", None))
    h = torch.relu(x @ w)
    total = h.sum()  # a scalar
    ones = torch.ones_like(h) + h  # a factory op inside the computation
    col = h.mean(dim=0)
    torchspmd.sync()
    expected_h = torch.relu(x_cpu @ w_cpu)
    for out, expected in [(h, expected_h), (total, expected_h.sum()),
                          (ones, expected_h + 1), (col, expected_h.mean(dim=0))]:
        assert devices_of(out) <= ids(B)
        torch.testing.assert_close(out.cpu(), expected)


def test_one_program_runs_where_each_call_s_inputs_live():
    # The same graph (one compiled program) fed, in turn, data on all devices, on A, on
    # B and on all devices again: each run goes where its inputs are, whatever the run
    # before it found (the runtime remembers the last run's input layouts).
    cpu = [torch.randn(4, 4) for _ in range(4)]
    results = []
    for x_cpu, mesh in zip(cpu, (None, A, B, None)):
        x = (x_cpu.to("spmd") + 0) if mesh is None else x_cpu.to("spmd")
        if mesh is not None:
            mark_sharding(x, mesh, ("x", "y"))
        torchspmd.sync()
        for _ in range(2):  # the second time, every input is as the first time left it
            x = x * 2 + 1
            torchspmd.sync()
            x_cpu = x_cpu * 2 + 1
        results.append((x, x_cpu, ALL if mesh is None else ids(mesh)))
    for x, expected, devices in results:
        assert devices_of(x) == devices
        torch.testing.assert_close(x.cpu(), expected)


def test_factory_tensors_are_unsharded_data_on_every_device():
    """``torch.randn(..., device=...)`` is replicated like ``.to(device)`` data (DESIGN)."""
    x = torch.randn(4, 4, device="spmd")
    x.cpu()
    assert devices_of(x) == ALL
    y = torch.randn(4, 4).to("spmd")
    mark_sharding(y, A, ("x", "y"))
    torch.testing.assert_close((y @ x).cpu(), y.cpu() @ x.cpu())


# --- unsharded data mixes with sub-mesh data without a copy through the host ----------

def test_unsharded_device_data_lends_its_sub_mesh_buffers_without_host_copies():
    u_cpu, x_cpu = torch.randn(4, 4), torch.randn(4, 4)
    u = on_device(u_cpu)  # replicated on all 8 devices
    x = x_cpu.to("spmd")
    mark_sharding(x, B, ("x", "y"))
    (x + 0).cpu()  # x's shards are on devices 4-7 now
    torchspmd.reset_metrics()
    y = x @ u
    torchspmd.sync()
    assert torchspmd.metrics()["bytes_to_device"] == 0
    assert torchspmd.metrics()["bytes_to_host"] == 0
    assert devices_of(y) <= ids(B)
    torch.testing.assert_close(y.cpu(), x_cpu @ u_cpu)
    assert torchspmd.metrics()["bytes_to_host"] == 4 * 4 * 4  # just the result, read once
    assert devices_of(u) == ALL  # lending did not move u


def test_unsharded_data_lent_to_a_sub_mesh_stays_usable_everywhere():
    u_cpu = torch.randn(8, 8)
    u = u_cpu.to("spmd")  # never marked, first used on a sub-mesh
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, A, ("x", "y"))
    torch.testing.assert_close((x @ u).cpu(), x.cpu() @ u_cpu)
    assert get_sharding(u) == ""
    on_b = torch.randn(8, 8).to("spmd")
    mark_sharding(on_b, B, ("x", "y"))
    torch.testing.assert_close((on_b + u).cpu(), on_b.cpu() + u_cpu)
    everywhere = torch.randn(8, 8).to("spmd")
    mark_sharding(everywhere, Mesh(np.arange(N), (2, 4)), (0, 1))
    torch.testing.assert_close((everywhere + u).cpu(), everywhere.cpu() + u_cpu)
    torch.testing.assert_close((u * 3).cpu(), u_cpu * 3)


# --- two sub-meshes alive at once ------------------------------------------------------

ORDERS = ["a_then_b", "b_then_a", "both_pending_one_sync", "interleaved_reads"]


@pytest.mark.parametrize("order", ORDERS)
def test_two_sub_meshes_side_by_side(order):
    a_cpu, b_cpu = torch.randn(4, 4), torch.randn(4, 4)
    a, b = a_cpu.to("spmd"), b_cpu.to("spmd")
    mark_sharding(a, A, ("x", "y"))
    mark_sharding(b, B, (None, "y"))
    if order == "a_then_b":
        ya = (a @ a).cpu()
        yb = (b @ b + 1).cpu()
    elif order == "b_then_a":
        yb = (b @ b + 1).cpu()
        ya = (a @ a).cpu()
    elif order == "both_pending_one_sync":
        ra, rb = a @ a, b @ b + 1
        torchspmd.sync()  # two independent computations: one program per sub-mesh
        ya, yb = ra.cpu(), rb.cpu()
        assert devices_of(ra) <= ids(A) and devices_of(rb) <= ids(B)
    else:
        ra = a @ a
        rb = b @ b + 1
        yb = rb.cpu()
        ra = ra * 1
        ya = ra.cpu()
    torch.testing.assert_close(ya, a_cpu @ a_cpu)
    torch.testing.assert_close(yb, b_cpu @ b_cpu + 1)
    # both still alive, on their own devices, and usable again
    assert devices_of(a) == ids(A) and devices_of(b) == ids(B)
    torch.testing.assert_close((a - 1).cpu(), a_cpu - 1)
    torch.testing.assert_close((b - 1).cpu(), b_cpu - 1)


# --- one computation on two device sets is refused --------------------------------------

def _mixed(mesh_a: Mesh, spec_a, mesh_b: Mesh, spec_b):
    a, b = torch.randn(4, 4).to("spmd"), torch.randn(4, 4).to("spmd")
    mark_sharding(a, mesh_a, spec_a)
    mark_sharding(b, mesh_b, spec_b)
    return a, b


@pytest.mark.parametrize("when", ["pending_marks", "device_data"])
def test_mixing_two_sub_meshes_names_both_device_sets_and_the_fix(when):
    a, b = _mixed(Mesh([0, 1], (1, 2), ("x", "y")), ("x", "y"),
                  Mesh([3, 2], (1, 2), ("x", "y")), ("x", "y"))
    if when == "device_data":
        (a + 0).cpu(), (b + 0).cpu()
    with pytest.raises(MeshMismatchError) as info:
        (a @ b).cpu()
    message = str(info.value)
    # Device data is stored over its devices in id order (xla_shardings), pending marks
    # name the mesh's order: either way, both device sets.
    assert "[0, 1]" in message and ("[3, 2]" in message or "[2, 3]" in message)
    assert "clear_sharding" in message and "mark_sharding" in message
    assert isinstance(info.value, RuntimeError)


def test_mixing_a_sub_mesh_with_the_full_mesh_is_refused():
    a, b = _mixed(Mesh([2, 3], (1, 2), ("x", "y")), ("x", "y"),
                  Mesh(np.arange(N), (2, 4), ("x", "y")), ("x", "y"))
    with pytest.raises(MeshMismatchError, match=r"all 8 devices.*\[2, 3\]"):
        (a + b).cpu()


def test_the_suggested_fix_works():
    a_cpu, b_cpu = torch.randn(4, 4), torch.randn(4, 4)
    a, b = a_cpu.to("spmd"), b_cpu.to("spmd")
    mark_sharding(a, A, ("x", "y"))
    mark_sharding(b, B, ("x", "y"))
    with pytest.raises(MeshMismatchError):
        (a @ b).cpu()
    clear_sharding(b)
    mark_sharding(b, A, (None, "y"))
    torch.testing.assert_close((a @ b).cpu(), a_cpu @ b_cpu)


# --- moving a tensor from one sub-mesh to another ---------------------------------------

@pytest.mark.parametrize("spec", [("x", "y"), (None, "y"), (None, None)],
                         ids=["tiled", "partial", "replicated"])
@pytest.mark.parametrize("state", ["host", "device"])
def test_reshard_from_one_sub_mesh_to_another(spec, state):
    cpu = torch.randn(8, 8)
    x = cpu.to("spmd")
    mark_sharding(x, A, ("x", "y"))
    if state == "device":
        (x + 0).cpu()
        assert devices_of(x) == ids(A)
    clear_sharding(x)
    xst = mark_sharding(x, B, spec)
    assert devices_of(x) == ids(B)
    assert {s.shard_device for s in xst.local_shards} == {f"CPU:{i}" for i in ids(B)}
    for shard in xst.local_shards:
        index = Ellipsis if shard.indices is Ellipsis else tuple(shard.indices)
        torch.testing.assert_close(shard.unpadded_data, cpu[index])
    y = x * 2 + 1
    torch.testing.assert_close(y.cpu(), cpu * 2 + 1)
    assert devices_of(y) <= ids(B)


def test_resharded_tensor_works_with_the_new_meshs_tensors():
    x_cpu, w_cpu = torch.randn(8, 8), torch.randn(8, 8)
    x = x_cpu.to("spmd")
    mark_sharding(x, A, ("x", None))
    (x + 0).cpu()
    w = w_cpu.to("spmd")
    mark_sharding(w, B, (None, "y"))
    mark_sharding(clear_sharding(x), B, ("x", None))
    # Tiles {7,6} and {5,4}, each replica group listed in ascending id as PyTorch/XLA does.
    assert get_sharding(x) == "{devices=[2,1,2]6,7,4,5 last_tile_dim_replicate}"
    torch.testing.assert_close((x @ w).cpu(), x_cpu @ w_cpu)


def test_a_pending_result_moves_to_another_mesh_once_computed():
    """A graph runs on one device set, so a constraint cannot carry data across sets:
    compute the value where its inputs are, then move the data with mark_sharding."""
    x_cpu = torch.randn(4, 4)
    x = x_cpu.to("spmd")
    mark_sharding(x, A, ("x", "y"))
    y = x + 1
    annotate_custom_sharding(y, B, ("x", "y"))
    with pytest.raises(MeshMismatchError) as info:
        y.cpu()
    assert "[0, 1, 2, 3]" in str(info.value) and "[7, 6, 5, 4]" in str(info.value)
    clear_sharding(y)  # drops the pending constraint
    torchspmd.sync()
    assert devices_of(y) == ids(A)
    mark_sharding(clear_sharding(y), B, ("x", "y"))
    assert devices_of(y) == ids(B)
    assert get_sharding(y) == "{devices=[2,2]7,6,5,4}"
    torch.testing.assert_close(y.cpu(), x_cpu + 1)


# --- two models trained at once, one per half of the devices ----------------------------

STEPS = 4


def _fsdp_spec(p: torch.Tensor) -> tuple:
    largest = list(p.shape).index(max(p.shape))
    return tuple("y" if d == largest else None for d in range(p.dim()))


def _data(seed: int, d_in: int, d_out: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, d_in, generator=g), torch.randn(8, d_out, generator=g))
            for _ in range(STEPS)]


@pytest.mark.parametrize("syncs", ["one_sync_per_step", "sync_per_model"])
def test_two_mlps_train_at_once_on_two_sub_meshes(syncs):
    torch.manual_seed(0)
    models = {"A": MLP((8, 16, 16, 4)), "B": MLP((6, 12, 4))}
    meshes = {"A": A, "B": B}
    data = {"A": _data(1, 8, 4), "B": _data(2, 6, 4)}
    setups = {}
    for name, model in models.items():
        m = copy.deepcopy(model).to("spmd")
        for p in m.parameters():
            mark_sharding(p, meshes[name], _fsdp_spec(p))
        setups[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-2))
    losses = {"A": [], "B": []}
    compiled = []
    for step in range(STEPS):
        pending = {}
        for name, (m, opt) in setups.items():
            x, y = (t.to("spmd") for t in data[name][step])
            mark_sharding(x, meshes[name], ("x", None))
            mark_sharding(y, meshes[name], ("x", None))
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            pending[name] = loss
            if syncs == "sync_per_model":
                torchspmd.sync()
        if syncs == "one_sync_per_step":
            torchspmd.sync()
        for name, loss in pending.items():
            losses[name].append(loss.item())
        compiled.append(torchspmd.metrics()["graphs_compiled"])
    for name, model in models.items():
        np.testing.assert_allclose(losses[name], adamw_reference_losses(model, data[name]), rtol=1e-4)
        for p in setups[name][0].parameters():
            assert devices_of(p) == ids(meshes[name])
    assert compiled[-1] == compiled[2], f"recompiled after step 3: {compiled}"


# --- the example and the benchmark run -----------------------------------------------------

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load(relative: str):
    spec = importlib.util.spec_from_file_location(
        f"_submesh_{os.path.basename(relative)[:-3]}", os.path.join(ROOT, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_models_example_matches_cpu_on_its_two_halves(capsys):
    result = _load("examples/two_models.py").main(["--steps", "3"])
    for name in ("A", "B"):
        np.testing.assert_allclose(result["losses"][name], result["cpu_losses"][name], rtol=1e-4)
        mesh_ids = set(result["meshes"][name].device_ids.tolist())
        for p in result["models"][name][0].parameters():
            assert devices_of(p) == mesh_ids
    assert set(result["meshes"]["A"].device_ids.tolist()).isdisjoint(
        result["meshes"]["B"].device_ids.tolist())
    assert "A spmd" in capsys.readouterr().out


def test_benchmark_runs_with_tiny_sizes(capsys):
    """Smoke only: both sides run, agree on losses, do not recompile (no time thresholds)."""
    bench = _load("benchmarks/submesh.py")
    args = ["--steps", "2", "--warmup", "2", "--rounds", "1", "--batch", "8", "--dim", "8",
            "--layers", "1"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "ratio sub-mesh / full" in out and "[4, 5, 6, 7] of 8 devices" in out
