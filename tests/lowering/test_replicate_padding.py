"""The gradient of ``F.pad(..., mode="replicate")`` matches CPU PyTorch in 1-D, 2-D and
3-D, with uneven and cropping (negative) amounts. ``replication_pad*_backward`` had no
lowering: training through replicate padding raised."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEV = torchspmd.device()


@pytest.mark.parametrize("shape,pad", [
    ((2, 3, 5), (1, 2)),
    ((2, 3, 5), (3, -1)),
    ((1, 2, 4, 5), (1, 2, 0, 3)),
    ((1, 1, 3, 3, 4), (1, 1, 2, 0, 1, 2)),
])
def test_replicate_padding_gradient_matches_cpu(shape, pad):
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g)
    weight = torch.randn(*F.pad(x, pad, mode="replicate").shape, generator=g)
    grads = []
    for dev in ("cpu", DEV):
        xs = x.clone().to(dev).requires_grad_()
        (F.pad(xs, pad, mode="replicate") * weight.to(dev)).sum().backward()
        grads.append(xs.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)
