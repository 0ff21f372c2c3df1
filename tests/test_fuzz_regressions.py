"""Programs the differential fuzzer (``torchspmd.testing.fuzz``) found wrong, each reduced
to its few lines and compared with CPU PyTorch."""

from __future__ import annotations

import torch

import torchspmd
from torchspmd.sharding import Mesh, annotate_custom_sharding

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
