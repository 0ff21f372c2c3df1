"""Programs the differential fuzzer (``torchspmd.testing.fuzz``) found wrong, each reduced
to its few lines and compared with CPU PyTorch."""

from __future__ import annotations

import torch

import torchspmd
from torchspmd.sharding import Mesh, annotate_custom_sharding, get_sharding

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
