"""Complex tensors on the spmd device, against CPU PyTorch.

Transfers, the views that reinterpret a complex tensor as real (``.real``, ``.imag``,
``view_as_real``) and back, conjugation (the device has no conjugate bit: ``conj()`` is a
view whose value is conjugated), and reductions whose result is real.
"""

import numpy as np
import pytest
import torch

from torchspmd.sharding import Mesh, mark_sharding

g = torch.Generator().manual_seed(0)
TOL = dict(atol=1e-5, rtol=1e-5)


def crandn(*shape, dtype=torch.complex64):
    return torch.randn(*shape, generator=g, dtype=dtype)


def assert_same(actual: torch.Tensor, expected: torch.Tensor):
    assert actual.device.type == "spmd"
    torch.testing.assert_close(actual.cpu(), expected, **TOL)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_upload_and_download_keep_values_and_dtype(dtype):
    z = crandn(4, 3, dtype=dtype)
    assert_same(z.to("spmd"), z)


def test_a_sharded_complex_tensor_downloads_whole():
    z = crandn(8, 4)
    zs = z.to("spmd")
    mark_sharding(zs, Mesh(np.arange(8), (4, 2)), (0, 1))
    assert_same(zs * 2j, z * 2j)


def test_complex_builds_from_real_and_imaginary_parts():
    re, im = torch.randn(5, generator=g), torch.randn(5, generator=g)
    assert_same(torch.complex(re.to("spmd"), im.to("spmd")), torch.complex(re, im))


def test_polar_builds_from_magnitude_and_angle():
    r, theta = torch.rand(5, generator=g), torch.randn(5, generator=g)
    assert_same(torch.polar(r.to("spmd"), theta.to("spmd")), torch.polar(r, theta))


def test_writing_imag_changes_the_complex_tensor():
    z = crandn(4, 3)
    zs = z.to("spmd")
    zs.imag.mul_(3)
    z.imag.mul_(3)
    assert_same(zs, z)


def test_writing_real_of_a_slice_changes_only_that_slice():
    z = crandn(4, 3)
    zs = z.to("spmd")
    zs[1:].real.fill_(7)
    z[1:].real.fill_(7)
    assert_same(zs, z)


def test_writing_through_view_as_real_changes_the_complex_tensor():
    z = crandn(4, 3)
    zs = z.to("spmd")
    torch.view_as_real(zs)[2, :, 1].add_(5)
    torch.view_as_real(z)[2, :, 1].add_(5)
    assert_same(zs, z)


def test_writing_through_a_conj_view_conjugates_back():
    z = crandn(4, 3)
    zs = z.to("spmd")
    zs.conj().mul_(2j)
    z.conj().mul_(2j)
    assert_same(zs, z)


def test_vdot_conjugates_its_first_argument():
    a, b = crandn(6), crandn(6)
    assert_same(torch.vdot(a.to("spmd"), b.to("spmd")), torch.vdot(a, b))


def test_variance_of_a_complex_tensor_is_real():
    z = crandn(5, 4)
    assert_same(z.to("spmd").var(dim=0), z.var(dim=0))
    var, mean = torch.var_mean(z.to("spmd"), dim=1)
    torch.testing.assert_close((var.cpu(), mean.cpu()), torch.var_mean(z, dim=1), **TOL)


@pytest.mark.parametrize("ord", [1, 2, float("inf"), 3])
def test_vector_norm_of_a_complex_tensor_uses_magnitudes(ord):
    z = crandn(5, 4)
    assert_same(torch.linalg.vector_norm(z.to("spmd"), ord, dim=1),
                torch.linalg.vector_norm(z, ord, dim=1))


def test_complex32_is_refused_with_what_to_use_instead():
    with pytest.raises(TypeError, match="complex32.*use torch.complex64"):
        crandn(3).to("spmd").to(torch.complex32)
