"""debug.pending_hlo / propagated_shardings: what XLA will be given, before anything runs."""

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.debug import _get_xla_tensors_hlo, pending_hlo, propagated_shardings
from torchspmd.sharding import Mesh, get_sharding, mark_sharding
from torchspmd.sharding.hlo_text import parse_hlo_text

DEV = torchspmd.device()
MESH = Mesh(np.arange(8), (8,), ("x",))
ROWS = "{devices=[8,1]0,1,2,3,4,5,6,7}"
CPU = torch.arange(64.).reshape(16, 4)


def _sharded_input():
    x = CPU.to(DEV)
    mark_sharding(x, MESH, ("x", None))
    return x


def _parameter_sharding(text: str) -> str:
    line = next(l for l in text.splitlines() if "parameter(0), sharding=" in l)
    return parse_hlo_text(line.split("sharding=")[1].split(", frontend")[0]).to_v1()


def test_pending_hlo_is_an_hlo_module_with_the_inputs_layout():
    y = (_sharded_input() * 2).sum(dim=1)
    text = pending_hlo([y])
    assert text.startswith("HloModule") and "ENTRY" in text and "reduce(" in text
    assert _parameter_sharding(text) == ROWS


def test_a_mark_sharding_on_a_pending_value_is_a_sharding_custom_call():
    y = _sharded_input() + 1
    mark_sharding(y, MESH, (None, None))
    text = pending_hlo([y])
    line = next(l for l in text.splitlines() if 'custom_call_target="Sharding"' in l)
    assert "sharding={replicated}" in line


def test_pending_hlo_runs_nothing_and_uploads_nothing():
    y = _sharded_input() * 3
    before = torchspmd.metrics()
    pending_hlo([y])
    after = torchspmd.metrics()
    for name in ("executions", "graphs_compiled", "bytes_to_device"):
        assert after[name] == before[name], name
    assert torch.equal(y.cpu(), CPU * 3)  # still pending, and still right


def test_several_tensors_are_outputs_of_one_module():
    x = _sharded_input()
    text = pending_hlo([x + 1, x * 2])
    root = next(l for l in text.splitlines() if l.strip().startswith("ROOT") and "ENTRY" not in l
                and "tuple(" in l)
    assert root.count("f32[16,4]") >= 2


def test_tensors_holding_data_have_no_pending_hlo():
    assert pending_hlo([_sharded_input()]) == ""


def test_pytorch_xla_name_is_the_same_function():
    assert _get_xla_tensors_hlo is pending_hlo


def test_an_intermediate_gets_the_sharding_xla_propagates_before_it_exists():
    y = (_sharded_input() * 2).sum(dim=1)
    assert get_sharding(y) == ""
    (propagated,) = propagated_shardings([y])
    assert propagated == "{devices=[8]0,1,2,3,4,5,6,7}"
    torchspmd.sync()
    assert get_sharding(y) == propagated  # what the executed program gave it


def test_propagated_shardings_run_nothing():
    y = _sharded_input().t() @ _sharded_input()
    executions = torchspmd.metrics()["executions"]
    propagated_shardings([y])
    assert torchspmd.metrics()["executions"] == executions
    torch.testing.assert_close(y.cpu(), CPU.t() @ CPU)


def test_data_reports_its_current_sharding():
    x = _sharded_input()
    assert propagated_shardings([x, x + 1])[0] == get_sharding(x) == ROWS


def test_a_sub_mesh_intermediate_reports_the_sub_meshs_real_ids():
    sub = Mesh([5, 4, 7, 6], (4,), ("x",))
    x = torch.randn(8, 4).to(DEV)
    mark_sharding(x, sub, ("x", None))
    # Over the sub-mesh's devices in id order: the layout XLA is given (xla_shardings).
    assert propagated_shardings([x * 2]) == ["{devices=[4,1]4,5,6,7}"]


def test_tensors_on_two_device_sets_are_refused_with_the_fix():
    sub = Mesh([5, 4, 7, 6], (4,), ("x",))
    a = torch.randn(8, 4).to(DEV)
    mark_sharding(a, sub, ("x", None))
    with pytest.raises(NotImplementedError, match="one set at a time"):
        pending_hlo([a * 2, _sharded_input() * 2])


def test_pending_program_compiles_to_the_partitioned_program_without_running():
    """pending_program gives the Lowered program: compiled, it is partitioned (per-device
    flops of an 8-way split matmul) and nothing ran (the tensor is still pending)."""
    from torchspmd.debug import pending_program, tensor_debug_info
    x = _sharded_input()
    y = x @ x.T
    compiled = pending_program([y]).compile()
    assert compiled.cost_analysis()["flops"] == 2 * 2 * 16 * 4  # 2 of 16 rows per device
    assert "IR: [] aten::mm" in tensor_debug_info(y)
    assert pending_program([CPU.to(DEV)]) is None
