"""Activation lowerings found missing by real code: shrink backwards, rrelu with noise."""

import pytest
import torch

from tests.lowering.helpers import check_lowering, run_lowering

aten = torch.ops.aten
x = torch.tensor([[-2.0, -0.5, -0.25, 0.0], [0.25, 0.5, 0.75, 3.0]], dtype=torch.float64)
grad = torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(2, 4)


@pytest.mark.parametrize("op", [aten.hardshrink_backward.default, aten.softshrink_backward.default])
def test_shrink_backward_is_zero_inside_lambda(op):
    check_lowering(op, grad, x, 0.5)  # -0.5 and 0.5 are inside, as on CPU


def test_rrelu_with_noise_in_eval_uses_the_mean_slope():
    check_lowering(aten.rrelu_with_noise_functional.default, x, torch.zeros_like(x), 0.1, 0.3, False)


def test_rrelu_with_noise_in_training_draws_slopes_between_lower_and_upper():
    out, noise = run_lowering(aten.rrelu_with_noise_functional.default, x, torch.zeros_like(x),
                              0.1, 0.3, True)
    negative = x <= 0
    assert torch.all((noise[negative] >= 0.1) & (noise[negative] <= 0.3))
    assert torch.all(noise[~negative] == 1)
    torch.testing.assert_close(out, x * noise)


def test_rrelu_in_training_on_the_device_has_the_drawn_slopes_as_gradient():
    t = x.float().to("spmd").requires_grad_(True)
    out = torch.nn.functional.rrelu(t, 0.1, 0.3, training=True)
    out.sum().backward()
    slopes = (out / t).detach().cpu()  # x * slope / x (x != 0 here except one zero)
    expected = torch.where(x.float() > 0, 1.0, slopes)
    torch.testing.assert_close(t.grad.cpu()[x != 0], expected[x != 0])
