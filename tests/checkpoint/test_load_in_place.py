"""A load writes a tensor as an in-place write would: later work on it and its views,
eager or compiled, sees the loaded values under the tensor's own annotations."""

import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, mark_sharding
from tests.checkpoint.test_planners import load, save
from tests.step.helpers import assert_params_close, batches, mlp, on_device, train_step

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DEV = torchspmd.device()


def test_a_write_through_a_sub_mesh_view_after_loading_its_unannotated_base(tmp_path):
    # The load annotated the base with the layout XLA had chosen for it (replicated over
    # all devices), and the write through the view mixed that with the view's sub-mesh.
    cpu = torch.arange(9.).reshape(3, 3)
    base = cpu.to(DEV) * 1  # computed: XLA lays it out
    view = base[2:3].transpose(1, 0)
    mark_sharding(view, Mesh([0, 1, 2, 3, 5, 6], (6, 1)), (0, 1))
    save({"base": base}, tmp_path)
    base.zero_()
    load({"base": base}, tmp_path)
    view.index_fill_(1, torch.tensor([0], device=DEV), -5)
    expected = cpu.clone()
    expected[2:3].transpose(1, 0).index_fill_(1, torch.tensor([0]), -5)
    assert torch.equal(base.cpu(), expected)


@pytest.mark.parametrize("load_state_dicts", [False, True], ids=["in-place", "load_state_dict"])
def test_a_compiled_step_after_a_load_trains_on_the_loaded_values(tmp_path, load_state_dicts):
    mesh = Mesh(list(range(8)), (4, 2), ("data", "model"))
    data = batches(4)
    cpu = mlp("cpu")
    cpu_opt = torch.optim.AdamW(cpu.parameters(), lr=0.01)
    cpu_step = train_step(cpu, cpu_opt)
    model = mlp(DEV)
    mark_sharding(model[0].weight, mesh, ("model", "data"))
    mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = torchspmd.compile(train_step(model, opt))
    for x, y in data[:2]:
        step(*on_device(x, y))
        cpu_step(x, y)
    save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path)
    step(*on_device(*data[2]))  # moves away from the checkpoint
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    load(state, tmp_path)
    if load_state_dicts:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    loss = step(*on_device(*data[3]))
    torch.testing.assert_close(loss.cpu(), cpu_step(*data[3]), rtol=1e-5, atol=1e-6)
    assert_params_close(model, cpu)
    for p, q in zip(model.parameters(), cpu.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key].cpu(), cpu_opt.state[q][key],
                                       rtol=1e-5, atol=1e-6, msg=key, check_dtype=key != "step")
