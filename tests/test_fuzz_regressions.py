"""Programs the differential fuzzer (``torchspmd.testing.fuzz``) found wrong, each reduced
to its few lines and compared with CPU PyTorch."""

from __future__ import annotations

import pytest
import torch

import torchspmd
from torchspmd.runtime.placement import MeshMismatchError
from torchspmd.sharding import Mesh, annotate_custom_sharding, get_sharding, mark_sharding

DEV = torchspmd.device()
PERMUTED = Mesh([1, 2, 4, 5, 0, 6, 3, 7], (8,), ("data",))


def test_a_value_computed_without_reading_its_input_stays_on_every_device():
    # `x.zero_()` no longer reads x; JAX dropped the unused input and ran on device 0 alone.
    x = torch.sigmoid(torch.ones(2, 4).to(DEV))
    x.zero_()
    x.cpu()
    y = torch.log_softmax(x, 0)
    annotate_custom_sharding(y, PERMUTED, (0, None))
    torch.testing.assert_close(y.cpu(), torch.log_softmax(torch.zeros(2, 4), 0))


def test_a_broadcasting_copy_into_an_annotated_tensor_keeps_its_annotation():
    # The target's rank-2 spec was applied to the rank-1 source before the broadcast.
    x = torch.zeros(5, 2, dtype=torch.int64).to(DEV)
    annotate_custom_sharding(x, Mesh([7, 5, 3, 6, 4, 1, 2, 0], (8, 1)), (1, 0))
    x.copy_(torch.tensor([3, 4]).to(DEV))
    assert x.cpu().tolist() == [[3, 4]] * 5
    assert get_sharding(x) == "{devices=[1,8]7,5,3,6,4,1,2,0}"


def test_annotating_sub_mesh_work_replicated_over_all_devices_is_a_mesh_mismatch():
    # A replicated annotation over all devices was ignored by placement, and JAX raised
    # "Received incompatible devices for jitted computation".
    x = torch.arange(8.).to(DEV)
    mark_sharding(x, Mesh([3, 1, 7], (3,)), (0,))
    y = x * 2
    mark_sharding(y, Mesh(list(range(8)), (2, 4)), (None,))
    with pytest.raises(MeshMismatchError, match="sub-mesh"):
        y.cpu()


def test_a_broadcasting_copy_into_a_reshaped_view_writes_its_base():
    # The broadcast source kept expand's zero strides and could not be reshaped back.
    x = torch.arange(6.).to(DEV) - 3
    view = x.reshape(2, 3)
    view.copy_(torch.ones(3).to(DEV))
    assert view.cpu().tolist() == [[1.0] * 3] * 2
    assert x.cpu().tolist() == [1.0] * 6
