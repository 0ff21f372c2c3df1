"""A load writes a tensor as an in-place write would: later work on it and its views,
eager or compiled, sees the loaded values under the tensor's own annotations."""

import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, mark_sharding
from tests.checkpoint.test_planners import load, save

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
