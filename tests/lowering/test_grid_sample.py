"""``F.grid_sample`` forward and backward (input and grid gradients) match CPU PyTorch in
every mode, padding and corner alignment, in 2-D and 3-D. Its backward had no lowering:
training through ``grid_sample`` raised at ``grid_sampler_2d_backward``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEV = torchspmd.device()

CASES = [(dims, mode, pad, corners)
         for dims in (2, 3)
         for mode, pad, corners in itertools.product(("bilinear", "nearest", "bicubic"),
                                                     ("zeros", "border", "reflection"),
                                                     (False, True))
         if not (dims == 3 and mode == "bicubic")]


@pytest.mark.parametrize("dims,mode,pad,corners", CASES)
def test_grid_sample_and_both_gradients_match_cpu(dims, mode, pad, corners):
    g = torch.Generator().manual_seed(dims)
    x = torch.randn(2, 3, *([5] * dims), generator=g)
    # Coordinates past [-1, 1] on purpose: the padding modes decide what they read.
    grid = torch.rand(2, *([4] * dims), dims, generator=g) * 2.6 - 1.3
    weight = torch.randn(2, 3, *([4] * dims), generator=g)
    results = []
    for dev in ("cpu", DEV):
        xs, gs = (t.clone().to(dev).requires_grad_() for t in (x, grid))
        out = F.grid_sample(xs, gs, mode=mode, padding_mode=pad, align_corners=corners)
        (out * weight.to(dev)).sum().backward()
        results.append([t.detach().cpu() for t in (out, xs.grad, gs.grad)])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def test_a_spatial_transformer_trains_with_a_sharded_batch():
    mesh = torchspmd.Mesh(np.arange(8), (8,), ("data",))
    torch.manual_seed(0)
    theta = torch.nn.Linear(16, 6)
    models = {"cpu": theta, "spmd": torch.nn.Linear(16, 6).to(DEV)}
    models["spmd"].load_state_dict(theta.state_dict())
    x = torch.randn(8, 1, 4, 4)
    grads = {}
    for name, model in models.items():
        inputs = x.to(model.weight.device)
        if name == "spmd":
            torchspmd.mark_sharding(inputs, mesh, ("data", None, None, None))
        affine = model(inputs.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(affine, list(inputs.shape), align_corners=False)
        F.grid_sample(inputs, grid, align_corners=False).square().mean().backward()
        grads[name] = model.weight.grad.cpu()
    torch.testing.assert_close(grads["spmd"], grads["cpu"], rtol=1e-5, atol=1e-6)
