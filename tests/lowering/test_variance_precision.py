"""Variances and normalizations keep their precision on data far from zero.

A variance computed as ``mean((x - mean(x))**2)`` carries the first mean's rounding error
``e`` as ``+e**2`` per element: on float32 data with mean 1e4 and std 0.1 that made
``var`` 1e-4 off (relatively) where CPU PyTorch, accumulating in float64, is 1e-8 off,
and it shifted every normalized value. The corrected two-pass form takes it back out.
Each check compares against the float64 result, beside CPU PyTorch's own float32 error.
"""

import pytest
import torch
import torch.nn.functional as F

from tests.step.helpers import DEVICE

NORMS = {
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "layer_norm": lambda x: F.layer_norm(x.T.contiguous(), (x.shape[0],)),
    "group_norm": lambda x: F.group_norm(x[None].transpose(1, 2).contiguous(), 4),
    "instance_norm": lambda x: F.instance_norm(x[None].transpose(1, 2).contiguous()),
}
VARIANCES = {
    "var": lambda x: x.var(0),
    "std": lambda x: x.std(0),
    "var_mean": lambda x: torch.var_mean(x, 0, correction=0)[0],
}


def far_from_zero(mean: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 16, generator=g) * 0.1 + mean


def error(f, x: torch.Tensor, device) -> float:
    """``f``'s largest error on ``x`` computed on ``device``, relative to float64 on CPU."""
    truth = f(x.double())
    return ((f(x.to(device)).cpu().double() - truth).abs().max() / truth.abs().max()).item()


@pytest.mark.parametrize("mean", [1e2, 1e4])
@pytest.mark.parametrize("name", list(VARIANCES))
def test_a_variance_of_data_far_from_zero_is_float32_accurate(name, mean):
    x = far_from_zero(mean)
    assert error(VARIANCES[name], x, DEVICE) < 1e-6  # was 1e-4 at mean 1e4


@pytest.mark.parametrize("mean", [1e2, 1e4])
@pytest.mark.parametrize("name", list(NORMS))
def test_a_normalization_of_data_far_from_zero_is_as_accurate_as_cpus(name, mean):
    x = far_from_zero(mean)
    assert error(NORMS[name], x, DEVICE) <= error(NORMS[name], x, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [3, 64, 4097])
def test_a_constant_inputs_std_is_exactly_zero(n, dtype):
    x = torch.full((n,), 1 / 3, dtype=dtype).to(DEVICE)
    assert x.std().item() == 0 and x.var().item() == 0


def test_a_batch_norms_running_variance_is_as_accurate_as_cpus():
    x = far_from_zero(1e4)
    cpu, spmd = torch.nn.BatchNorm1d(16), torch.nn.BatchNorm1d(16).to(DEVICE)
    cpu(x)
    spmd(x.to(DEVICE))
    truth = torch.nn.BatchNorm1d(16).double()
    truth(x.double())
    got = (spmd.running_var.cpu().double() - truth.running_var).abs().max()
    assert got <= (cpu.running_var.double() - truth.running_var).abs().max() + 1e-9
