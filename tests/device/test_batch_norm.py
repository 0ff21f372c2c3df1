"""Batch norm on the device: eval mode returns no batch statistics, as PyTorch's kernels do."""

import pytest
import torch

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
x = torch.randn(3, 2, 4, generator=g)
weight, bias = torch.rand(2, generator=g) + 0.5, torch.randn(2, generator=g)
mean, var = torch.randn(2, generator=g), torch.rand(2, generator=g) + 0.5


@pytest.mark.parametrize("op", [aten.native_batch_norm.default, aten._native_batch_norm_legit.default])
def test_eval_batch_norm_returns_empty_statistics(op):
    args = (weight, bias, mean, var, False, 0.1, 1e-5)
    expected = op(x, *args)
    actual = op(x.to("spmd"), *(a.to("spmd") if isinstance(a, torch.Tensor) else a for a in args))
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e)


def test_eval_batch_norm_gradients_match_cpu():
    grads = []
    for device in ("cpu", "spmd"):
        leaves = [t.detach().to(device).requires_grad_(True) for t in (x, weight, bias)]
        out = torch.nn.functional.batch_norm(leaves[0], mean.to(device), var.to(device),
                                             leaves[1], leaves[2], training=False)
        (out * out).sum().backward()
        grads.append([t.grad.cpu() for t in leaves])
    for a, e in zip(*grads):
        torch.testing.assert_close(a, e)


def test_training_batch_norm_through_legit_updates_running_stats_like_cpu():
    stats_cpu = [mean.clone(), var.clone()]
    stats = [t.to("spmd") for t in stats_cpu]
    expected = aten._native_batch_norm_legit(x, weight, bias, *stats_cpu, True, 0.1, 1e-5)
    actual = aten._native_batch_norm_legit(x.to("spmd"), weight.to("spmd"), bias.to("spmd"),
                                           *stats, True, 0.1, 1e-5)
    for a, e in zip(list(actual) + stats, list(expected) + stats_cpu):
        torch.testing.assert_close(a.cpu(), e)
