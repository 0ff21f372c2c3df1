"""Weight norm (``torch._weight_norm``, Wav2Vec2's positional convolution) against CPU PyTorch.

The forward ``_weight_norm_interface`` reaches the device through PyTorch's decomposition;
its backward ``_weight_norm_interface_backward`` has no decomposition and is lowered.
"""

import pytest
import torch

import torchspmd
from tests.lowering.test_linalg import check_lowering  # under jax.jit

aten = torch.ops.aten
F64 = dict(atol=1e-10, rtol=1e-10)

# (v shape, dim): PyTorch's fused kernel takes the first or the last dim.
CASES = {"first": ((4, 3, 5), 0), "last": ((4, 3, 5), 2), "matrix_last": ((6, 7), 1)}


def _saved(shape, dim, dtype):
    """``v``, ``g`` and the norms the CPU forward saves for its backward."""
    v = torch.randn(*shape, dtype=dtype)
    g_shape = [1] * len(shape)
    g_shape[dim] = shape[dim]
    g = torch.randn(*g_shape, dtype=dtype)
    _, norms = aten._weight_norm_interface(v, g, dim)
    return v, g, norms


@pytest.mark.parametrize("case", CASES)
def test_weight_norm_interface_backward_matches_cpu(case):
    shape, dim = CASES[case]
    v, g, norms = _saved(shape, dim, torch.float64)
    check_lowering(aten._weight_norm_interface_backward.default, torch.randn(*shape, dtype=torch.float64),
                   v, g, norms, dim, **F64)


def test_weight_norm_interface_backward_bfloat16_computes_in_float32():
    v, g, norms = _saved((4, 3, 5), 0, torch.bfloat16)
    assert norms.dtype == torch.float32  # the CPU forward's norms are in opmath
    check_lowering(aten._weight_norm_interface_backward.default, torch.randn(4, 3, 5, dtype=torch.bfloat16),
                   v, g, norms, 0, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", CASES)
def test_weight_norm_forward_and_backward_on_device_match_cpu(case):
    """``torch._weight_norm`` with autograd, as ``nn.utils.parametrizations.weight_norm`` calls it."""
    shape, dim = CASES[case]
    v, g, _ = _saved(shape, dim, torch.float32)
    grad = torch.randn(*shape)
    cpu = [t.clone().requires_grad_() for t in (v, g)]
    dev = [t.to(torchspmd.device()).requires_grad_() for t in (v, g)]
    expected = torch._weight_norm(*cpu, dim)
    actual = torch._weight_norm(*dev, dim)
    expected.backward(grad)
    actual.backward(grad.to(torchspmd.device()))
    torch.testing.assert_close(actual.cpu(), expected)
    for d, c in zip(dev, cpu):
        torch.testing.assert_close(d.grad.cpu(), c.grad)
