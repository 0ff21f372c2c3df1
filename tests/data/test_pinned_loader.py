"""``DataLoader(pin_memory=True)``, the usual CUDA loop's loader, feeds the spmd device:
PyTorch pins for the current accelerator (spmd), whose pinned memory is ordinary host
memory (a Python backend cannot give PyTorch a pinned allocator). It raised PyTorch's
``NotImplementedError`` about ``PrivateUse1HooksInterface`` at the first batch."""

from __future__ import annotations

import pytest
import torch

import torchspmd

DEV = torchspmd.device()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pinned_loader_trains_as_an_unpinned_one(workers):
    data = torch.utils.data.TensorDataset(torch.randn(24, 6), torch.randn(24, 3))
    losses = {}
    for pin in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3).to(DEV)
        loader = torch.utils.data.DataLoader(data, batch_size=8, pin_memory=pin,
                                             num_workers=workers)
        losses[pin] = []
        for x, y in loader:
            x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
            losses[pin].append((model(x) - y).square().mean().item())
    assert losses[True] == losses[False]


def test_pinning_copies_the_tensor():
    x = torch.arange(4.0)
    pinned = x.pin_memory()
    x.add_(1)
    assert pinned.tolist() == [0.0, 1.0, 2.0, 3.0] and pinned.device.type == "cpu"


def test_pinning_for_the_cpu_is_still_pytorchs_error():
    with pytest.raises(RuntimeError, match="not an accelerator"):
        torch.arange(4.0).pin_memory("cpu")
