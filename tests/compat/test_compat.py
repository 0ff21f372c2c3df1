"""``torchspmd.compat`` in one process: names map onto torchspmd, the 'xla' device lands on
the spmd device, and what has no meaning here raises an error naming the call."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import torchspmd
import torchspmd.compat

torchspmd.compat.install()

import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402
from torch_xla.experimental.scan import scan  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _leave_torch_as_it_was():
    """Other tests in this process get PyTorch's own torch.tensor and Tensor.to back."""
    yield
    torchspmd.compat.uninstall()


def test_spmd_names_are_torchspmds():
    """torch_xla.distributed.spmd, and its old name, serve torchspmd's own objects."""
    from torch_xla.experimental import xla_sharding
    from torch_xla.distributed.fsdp import SpmdFullyShardedDataParallel

    assert xs.Mesh is torchspmd.Mesh and xla_sharding.mark_sharding is torchspmd.mark_sharding
    assert SpmdFullyShardedDataParallel is torchspmd.parallel.SpmdFullyShardedDataParallel
    assert xm.xla_device() == torch_xla.device() == torchspmd.device()
    assert xr.global_runtime_device_count() == torchspmd.device_count()


@pytest.mark.parametrize("platform, runtime, hw", [("cpu", "CPU", "CPU"), ("gpu", "CUDA", "GPU"),
                                                ("tpu", "TPU", "TPU")])
def test_platform_names_are_pytorch_xlas(monkeypatch, platform, runtime, hw):
    # JAX calls an NVIDIA GPU "gpu"; PyTorch/XLA's device_type() says CUDA, xla_device_hw GPU.
    class Device:
        pass

    device = Device()
    device.platform = platform
    monkeypatch.setattr(xr.jax, "devices", lambda *a: [device])
    monkeypatch.setattr(xm.jax, "devices", lambda *a: [device])
    assert (xr.device_type(), xm.xla_device_hw(None)) == (runtime, hw)


@pytest.mark.parametrize("name", ["xla", "xla:0"])
@pytest.mark.parametrize("make", [
    lambda d: torch.tensor([1.0, -2.0, 3.0], device=d),
    lambda d: torch.as_tensor(np.array([1.0, -2.0]), device=d),
    lambda d: torch.tensor([1.0, -2.0, 3.0]).to(d),
    lambda d: torch.tensor([1.0, -2.0, 3.0]).to(torch.device(d)),
    lambda d: torch.arange(3, dtype=torch.float32, device=d) * 2 - 1,
    lambda d: torch.full((2, 2), 3.0, device=d).cumsum(0),
    lambda d: torch.nn.Linear(2, 2, bias=False).to(d).weight.sum(),
], ids=["tensor", "as_tensor", "to", "to_device", "arange", "full", "module_to"])
def test_xla_device_name_gives_spmd_tensors(make, name):
    """A tensor made on 'xla' or 'xla:0' is an spmd tensor holding the values CPU gives."""
    torch.manual_seed(0)
    t = make(name)
    torch.manual_seed(0)
    expected = make("cpu")
    assert t.device == torchspmd.device()
    torch.testing.assert_close(t.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("call, names", [
    (lambda: torch.zeros(2, device="xla:1"), "xla:1"),
    (lambda: torch.tensor([1.0], device="xla:2"), "xla:2"),
    (lambda: xm.all_reduce("sum", []), "xm.all_reduce"),
    (lambda: xm.rendezvous("x"), "xm.rendezvous"),
    (lambda: xm.xla_device(3), "xm.xla_device(3)"),
    (lambda: xr.use_spmd(auto=True), "xr.use_spmd(auto=True)"),
    (lambda: met.metric_data("CompileTime"), "met.metric_data"),
    (lambda: torch_xla._XLAC._xla_sync_multi([]), "torch_xla._XLAC._xla_sync_multi"),
    (lambda: __import__("torch_xla.distributed.xla_multiprocessing").distributed
     .xla_multiprocessing.spawn(print), "xmp.spawn"),
])
def test_meaningless_calls_raise_naming_the_call(call, names):
    """Calls with no meaning under one SPMD program raise an error that names them."""
    with pytest.raises((NotImplementedError, RuntimeError), match=__import__("re").escape(names)):
        call()


def test_auto_sharding_request_points_to_auto_shard():
    """``xr.use_spmd(auto=True)`` says where torchspmd's auto-sharding is."""
    with pytest.raises((NotImplementedError, RuntimeError), match="torchspmd.auto_shard"):
        xr.use_spmd(auto=True)


def test_module_not_served_names_itself():
    """Importing a torch_xla module torchspmd does not serve says which one, and what is."""
    with pytest.raises(ModuleNotFoundError, match="torch_xla.distributed.xla_backend"):
        import torch_xla.distributed.xla_backend  # noqa: F401


def test_a_name_xm_does_not_serve_points_to_the_migration_guide():
    with pytest.raises(AttributeError, match="xla_model.get_stablehlo is not served.*migrating"):
        xm.get_stablehlo


def test_use_spmd_sets_the_environment_flag_scripts_read(monkeypatch):
    monkeypatch.delenv("XLA_USE_SPMD", raising=False)
    xr.use_spmd()
    import os

    assert os.environ["XLA_USE_SPMD"] == "1"


def test_send_cpu_data_to_device_uploads_sharded_and_lists_a_lone_tensor():
    """PyTorch/XLA returns a lone tensor in a list; nested data keeps its structure."""
    mesh = xs.Mesh(np.arange(8), (8,))
    spec = xs.ShardingSpec(mesh, (0, None))
    [x] = xm.send_cpu_data_to_device(torch.arange(16.).reshape(8, 2), xm.xla_device(), spec)
    assert xs.get_sharding(x) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert torch.equal(x.cpu(), torch.arange(16.).reshape(8, 2))
    batch = xm.send_cpu_data_to_device({"a": torch.ones(8, 2), "b": [torch.zeros(3)]},
                                       xm.xla_device(), spec)
    assert xm.is_xla_tensor(batch["a"]) and xm.is_xla_tensor(batch["b"][0])
    assert not xm.is_xla_tensor(torch.ones(1))


def test_device_attributes_name_each_device_in_id_order():
    names = [d["name"] for d in xr.global_runtime_device_attributes()]
    assert names == [f"{xr.device_type()}:{i}" for i in range(torchspmd.device_count())]


def test_dynamo_mark_sharding_annotates_in_place_and_gradients_flow():
    """The op of PyTorch/XLA's user guide, names and spec as Python literals; a CPU
    tensor passes through untouched, as there."""
    cpu = torch.randn(8, 4, requires_grad=True)
    x = cpu.detach().to(xm.xla_device()).requires_grad_(True)
    y = x * 2
    out = torch.ops.xla.dynamo_mark_sharding(y, list(range(8)), [4, 2], "('data', 'model')",
                                             "('data', 'model')")
    assert out is y
    assert xs.get_sharding(y) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    (out * out).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 8 * cpu.detach())
    plain = torch.ones(2)
    assert torch.ops.xla.dynamo_mark_sharding(plain, [0], [1], "('x',)", "('x',)") is plain


def test_checkpoint_module_recomputes_forward_with_cpus_gradients():
    from torch_xla.distributed.fsdp import checkpoint_module

    calls = []

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, scale=1.0):
            calls.append(1)
            return torch.tanh(self.fc(x)) * scale

    torch.manual_seed(0)
    cpu = Block()
    dev = checkpoint_module(copy.deepcopy(cpu).to(xm.xla_device()))
    x = torch.randn(3, 4)
    (cpu(x, scale=2.0) ** 2).sum().backward()
    calls.clear()
    (dev(x.to(xm.xla_device()), scale=2.0) ** 2).sum().backward()
    assert len(calls) == 2  # the forward, and its recomputation in the backward pass
    for a, b in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad)
    twin = copy.deepcopy(dev)  # a copy checkpoints its own forward
    twin.zero_grad(set_to_none=True)
    calls.clear()
    twin(x.to(xm.xla_device())).sum().backward()
    assert len(calls) == 2 and twin.fc.weight.grad is not None


def test_checkpoint_manager_takes_pytorch_xlas_arguments(tmp_path):
    """``num_of_threads`` and ``chkpt_on_preemption=False`` are accepted; the default
    ``True`` warns that no preemption checkpoint is taken; a process group is refused."""
    from torch_xla.experimental.distributed_checkpoint import CheckpointManager, SPMDSavePlanner

    assert SPMDSavePlanner is torchspmd.checkpoint.SPMDSavePlanner
    manager = CheckpointManager(tmp_path, 10, max_to_keep=2, num_of_threads=4,
                                chkpt_on_preemption=False)
    w = torch.arange(8.).to(xm.xla_device())
    assert manager.save(10, {"w": w}) and manager.all_steps() == [10]
    with pytest.warns(UserWarning, match="no checkpoint on preemption"):
        assert not CheckpointManager(tmp_path, 10).reached_preemption(10)
    with pytest.raises(NotImplementedError, match="process_group"):
        CheckpointManager(tmp_path, 10, process_group=object(), chkpt_on_preemption=False)


def test_construct_v1_sharding_str_is_the_v1_text_of_get_sharding():
    from torch_xla.distributed.spmd.debugging import construct_v1_sharding_str

    t = torch.randn(8, 4).to(xm.xla_device())
    wrapped = xs.mark_sharding(t, xs.Mesh(np.arange(8), (4, 2)), (0, None))
    text = "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert construct_v1_sharding_str(t) == construct_v1_sharding_str(wrapped) == text


def test_scan_matches_cpu_loop():
    """scan(fn, init, xs) returns the last carry and the stacked outputs a CPU loop gives,
    for pytrees of tensors."""
    def fn(carry, x):
        total = carry["sum"] + x["v"]
        return {"sum": total}, total * x["w"]

    values, weights = torch.randn(5, 3), torch.randn(5, 3)
    carry, ys = scan(fn, {"sum": torch.zeros(3, device="xla")},
                     {"v": values.to("xla"), "w": weights.to("xla")})
    expected_carry, expected_ys = torch.zeros(3), []
    for v, w in zip(values, weights):
        expected_carry = expected_carry + v
        expected_ys.append(expected_carry * w)
    torch.testing.assert_close(carry["sum"].cpu(), expected_carry, rtol=0, atol=0)
    torch.testing.assert_close(ys.cpu(), torch.stack(expected_ys), rtol=0, atol=0)


def test_counters_under_pytorch_xla_names():
    """met.counter_value('UncachedCompile') counts torchspmd's compiles; unknown names give None."""
    met.clear_counters()
    (torch.ones(3, device="xla") * 7).cpu()
    assert met.counter_value("UncachedCompile") == torchspmd.metrics()["graphs_compiled"] >= 0
    assert met.counter_value("ExecuteReplicated") == torchspmd.metrics()["executions"] >= 1
    assert met.counter_value("NoSuchCounter") is None


def test_step_closures_run_at_mark_step():
    """xm.add_step_closure's functions run, in order, at the next xm.mark_step."""
    seen = []
    t = torch.ones(2, device="xla") * 3
    xm.add_step_closure(lambda x: seen.append(x.cpu().tolist()), args=(t,))
    xm.add_step_closure(seen.append, args=("second",))
    assert seen == []
    xm.mark_step()
    assert seen == [[3.0, 3.0], "second"]


def test_uninstall_gives_torch_back():
    """After uninstall(), torch_xla is not importable and torch.tensor is PyTorch's again;
    install() serves both again."""
    import importlib
    wrapped = torch.tensor
    torchspmd.compat.uninstall()
    try:
        assert torch.tensor is not wrapped and not torchspmd.compat.is_installed()
        assert "to" not in torch.Tensor.__dict__
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("torch_xla")
    finally:
        torchspmd.compat.install()
    assert importlib.import_module("torch_xla.core.xla_model").xla_device() == torchspmd.device()


def test_xm_save_writes_cpu_tensors_of_sharded_values(tmp_path):
    """``xm.save`` gathers sharded values and writes CPU tensors, as PyTorch/XLA's."""
    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    weight = torch.arange(32.0).reshape(8, 4).to(xm.xla_device())
    xs.mark_sharding(weight, mesh, ("data", "model"))
    xm.save({"w": weight, "step": 3}, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt")
    assert state["step"] == 3 and state["w"].device.type == "cpu"
    torch.testing.assert_close(state["w"], torch.arange(32.0).reshape(8, 4), rtol=0, atol=0)


def test_sharding_spec_binding_reads_the_annotation():
    """``torch_xla._XLAC._get_xla_sharding_spec``, which scripts check shardings with."""
    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    t = torch.ones(8, 4, device="xla")
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == ""
    xs.mark_sharding(t, mesh, ("data", None))
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == torchspmd.get_sharding(t) != ""


def test_reduction_names_exist_and_the_collective_is_refused():
    with pytest.raises((NotImplementedError, RuntimeError), match="xm.all_reduce"):
        xm.all_reduce(xm.REDUCE_SUM, [torch.ones(2, device="xla")])
    assert (xm.REDUCE_SUM, xm.REDUCE_MAX) == ("sum", "max")


def test_pytorchs_own_parallelize_module_over_an_xla_device_mesh_shards_and_trains_like_cpu():
    """PyTorch/XLA's examples/tensor_parallel script: PyTorch's parallelize_module with
    ``init_device_mesh("xla", ...)`` (PyTorch/XLA fails in DTensor code there). Each style
    shards as torchspmd.parallel.parallelize_module does; values are CPU's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))
    model = copy.deepcopy(cpu).to(xm.xla_device())
    mesh = init_device_mesh("xla", (xr.global_runtime_device_count(),))  # no process group
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert torchspmd.get_sharding(model[0].weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert torchspmd.get_sharding(model[2].weight) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    x = torch.randn(4, 8)
    for m, inputs in ((cpu, x), (model, x.to(xm.xla_device()))):
        m(inputs).square().sum().backward()
    for p_cpu, p in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad)


def test_amp_autocast_scaler_and_syncfree_optimizer_train_like_cpu_autocast():
    """torch_xla.amp: autocast in bfloat16, GradScaler and syncfree.AdamW as on the CPU."""
    from torch_xla.amp import GradScaler, autocast, syncfree

    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    model = copy.deepcopy(cpu).to(xm.xla_device())
    runs = [(cpu, torch.optim.AdamW(cpu.parameters(), lr=0.01), torch.amp.GradScaler("cpu"),
             lambda: torch.autocast("cpu", dtype=torch.bfloat16), "cpu"),
            (model, syncfree.AdamW(model.parameters(), lr=0.01), GradScaler(),
             lambda: autocast(xm.xla_device()), xm.xla_device())]
    for step in range(3):
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(step))
        for m, opt, scaler, cast, device in runs:
            with cast():
                loss = m(x.to(device)).float().square().sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        xm.mark_step()
    for p_cpu, p in zip(cpu.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu)


def test_a_compiled_scaled_step_with_a_syncfree_optimizer_skips_an_inf_step_as_the_cpu():
    """PyTorch/XLA's reason for ``syncfree``: ``scaler.step`` inside
    ``torch_xla.compile(full_graph=True)`` reads nothing on the host, and the inf step is
    skipped on the device."""
    from torch_xla.amp import GradScaler, syncfree

    def run(device, opt_cls, scaler):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4).to(device)
        opt = opt_cls(model.parameters(), lr=0.01)

        def step(x):
            opt.zero_grad()
            scaler.scale(model(x).square().mean()).backward()
            scaler.step(opt)
            scaler.update()

        run_step = torch_xla.compile(step, full_graph=True) if device != "cpu" else step
        for i in range(5):
            x = torch.randn(2, 8, generator=torch.Generator().manual_seed(i))
            if i == 2:
                x[0, 0] = float("inf")
            run_step(x.to(device))
        return [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    cpu_params, cpu_scale = run("cpu", lambda p, lr: torch.optim.AdamW(p, lr=lr, fused=True),
                                torch.amp.GradScaler("cpu", init_scale=256.0))
    before = torchspmd.metrics()["step_replays"]
    params, scale = run(xm.xla_device(), syncfree.AdamW, GradScaler(init_scale=256.0))
    assert torchspmd.metrics()["step_replays"] - before >= 3
    assert scale == cpu_scale == 128.0
    for p, q in zip(params, cpu_params):
        torch.testing.assert_close(p, q)


def test_a_syncfree_step_given_found_inf_changes_nothing():
    from torch_xla.amp import syncfree

    model = torch.nn.Linear(3, 2).to(xm.xla_device())
    opt = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3, device=xm.xla_device())).sum().backward()
    before = [p.detach().cpu() for p in model.parameters()]
    opt.step(found_inf=torch.ones(1, device=xm.xla_device()))
    assert all(torch.equal(p.detach().cpu(), q) for p, q in zip(model.parameters(), before))
    opt.step(found_inf=torch.zeros(1, device=xm.xla_device()))
    assert not torch.equal(model.weight.detach().cpu(), before[0])


def test_profiler_records_a_trace_in_the_process(tmp_path):
    import torch_xla.debug.profiler as xp

    xp.start_trace(str(tmp_path))
    with xp.StepTrace("train", step_num=0), xp.Trace("forward"):
        (torch.ones(3, device=xm.xla_device()) * 2).cpu()
    xp.stop_trace()
    assert list(tmp_path.rglob("*.xplane.pb"))
    with pytest.raises(NotImplementedError, match=r"xp\.trace captures from a profiler server"):
        xp.trace("localhost:9012", str(tmp_path))


def test_step_context_runs_its_block_as_a_graph():
    x = torch.ones(2, device=xm.xla_device())
    with torch_xla.step():
        before = torchspmd.metrics()["executions"]
        y = x + 1
        assert torchspmd.metrics()["executions"] == before  # recorded, not run
    assert torchspmd.metrics()["executions"] == before + 1  # run when the block ends
    torch.testing.assert_close(y.cpu(), torch.full((2,), 2.0))


def test_the_modules_behind_xs_serve_the_same_names():
    from torch_xla.distributed.spmd import xla_sharded_tensor, xla_sharding

    assert xla_sharding.mark_sharding is xs.mark_sharding and xla_sharding.Mesh is xs.Mesh
    assert xla_sharded_tensor.XLAShardedTensor is torchspmd.XLAShardedTensor


def test_memory_info_names_a_backend_without_statistics():
    import jax

    if jax.local_devices()[0].memory_stats():
        assert xm.get_memory_info()["bytes_limit"] > 0
    else:
        with pytest.raises(NotImplementedError, match="reports no memory statistics"):
            xm.get_memory_info(xm.xla_device())
