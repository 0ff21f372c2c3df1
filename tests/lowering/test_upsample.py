"""Backward ops of F.interpolate against CPU PyTorch's kernels (up- and down-sampling)."""

import pytest
import torch

from tests.lowering.helpers import check_lowering

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
# (input size, output size, scales): integer, fractional and shrinking resamples.
RESIZES = {
    "up_fractional": ((2, 3, 5), (7,), None),
    "down": ((1, 2, 9), (4,), None),
    "given_scale": ((1, 2, 5), (7,), 1.5),
}


def _grad(output_size, input_size):
    return torch.randn(*input_size[:2], *output_size, generator=g)


def _spatial(case, spatial):
    """A resize of ``spatial`` dims built from a 1-d case (each axis its own lengths)."""
    (n, c, i), (o,), scale = RESIZES[case]
    inputs = (n, c) + tuple(i + k for k in range(spatial))
    outputs = tuple(o + 2 * k for k in range(spatial))
    return inputs, outputs, [scale] * spatial


@pytest.mark.parametrize("case,align_corners", [("up_fractional", False), ("given_scale", False),
                                                 ("down", True)])
@pytest.mark.parametrize("op,spatial", [(aten.upsample_linear1d_backward.default, 1),
                                        (aten.upsample_bilinear2d_backward.default, 2),
                                        (aten.upsample_trilinear3d_backward.default, 3),
                                        (aten.upsample_bicubic2d_backward.default, 2)])
def test_interpolating_backward(op, spatial, case, align_corners):
    inputs, outputs, scales = _spatial(case, spatial)
    scales = [None] * spatial if align_corners else scales
    check_lowering(op, _grad(outputs, inputs), outputs, inputs, align_corners, *scales, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["up_fractional", "down"])
@pytest.mark.parametrize("name", ["upsample_nearest", "_upsample_nearest_exact"])
@pytest.mark.parametrize("spatial", [1, 3])
def test_nearest_backward(name, spatial, case):
    op = getattr(aten, f"{name}{spatial}d_backward").default
    inputs, outputs, scales = _spatial(case, spatial)
    check_lowering(op, _grad(outputs, inputs), outputs, inputs, *scales, atol=1e-4, rtol=1e-4)


def test_interpolate_trains_on_the_device_like_cpu():
    x = torch.randn(1, 2, 5, 5, generator=g)
    grads = []
    for device in ("cpu", "spmd"):
        t = x.detach().to(device).requires_grad_(True)
        out = torch.nn.functional.interpolate(t, size=(8, 3), mode="bicubic")
        (out * out).sum().backward()
        grads.append(t.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-4, rtol=1e-4)
