"""Device-agnostic ``torch.accelerator`` calls work, or say why not, with spmd as the
current accelerator. ``synchronize()`` raised PyTorch's "Backend doesn't support
synchronizing all streams" and the memory statistics an INTERNAL ASSERT: a device
implemented in Python cannot register the C++ hooks PyTorch asks."""

from __future__ import annotations

import pytest
import torch

import torchspmd
from torchspmd.runtime.in_flight import in_flight_ids


def test_spmd_is_the_current_accelerator():
    assert torch.accelerator.current_accelerator().type == "spmd"


@pytest.mark.parametrize("device", [None, 0, "spmd", torch.device("spmd:0")])
def test_synchronize_waits_for_the_devices(device):
    x = torch.ones(64, 64, device="spmd") @ torch.ones(64, 64, device="spmd")
    torchspmd.sync()
    torch.accelerator.synchronize(device)
    assert not in_flight_ids()  # nothing left running
    assert x.cpu()[0, 0].item() == 64.0


def test_empty_cache_keeps_every_value():
    x = torch.arange(4.0, device="spmd") * 2
    torch.accelerator.empty_cache()
    assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_memory_statistics_say_where_jaxs_are():
    with pytest.raises(NotImplementedError, match=r"memory_allocated\(\).*memory_stats\(\)"):
        torch.accelerator.memory_allocated()


def test_another_device_type_goes_to_pytorch():
    with pytest.raises(Exception, match="(?i)cuda|accelerator|device"):
        torch.accelerator.synchronize("cuda")
