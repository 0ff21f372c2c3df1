"""FFT lowerings (``_fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c``) against CPU PyTorch."""

import numpy as np
import pytest
import torch

from tests.lowering.helpers import check_lowering
from torchspmd.sharding import Mesh, mark_sharding

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)
TOL = dict(atol=1e-4, rtol=1e-4)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("normalization", [0, 1, 2], ids=["none", "sqrt_n", "n"])
@pytest.mark.parametrize("forward", [True, False], ids=["forward", "inverse"])
def test_c2c_scales_by_the_normalization_mode_in_either_direction(normalization, forward):
    check_lowering(aten._fft_c2c.default, randn(4, 6, dtype=torch.complex64), [0, 1],
                   normalization, forward, **TOL)


def test_c2c_over_more_than_three_dims_matches_cpu():
    x = randn(2, 3, 4, 5, 2, dtype=torch.complex128)
    check_lowering(aten._fft_c2c.default, x, [0, 1, 2, 3, 4], 0, True)


def test_c2c_over_no_dims_is_a_copy():
    check_lowering(aten._fft_c2c.default, randn(3, dtype=torch.complex64), [], 2, True)


@pytest.mark.parametrize("normalization", [0, 1, 2], ids=["none", "sqrt_n", "n"])
def test_r2c_onesided_keeps_half_the_last_transformed_dim(normalization):
    # The halved dim is the last one *listed*, not the tensor's last dim.
    check_lowering(aten._fft_r2c.default, randn(4, 6, 5), [2, 0], normalization, True, **TOL)


def test_r2c_not_onesided_is_the_full_spectrum():
    check_lowering(aten._fft_r2c.default, randn(5, 6), [1], 1, False, **TOL)


@pytest.mark.parametrize("last_dim_size", [6, 7], ids=["even", "odd"])
def test_c2r_of_a_non_hermitian_input_ignores_what_a_real_signal_cannot_have(last_dim_size):
    # Random complex input: its zero (and Nyquist) bins have imaginary parts, which
    # PyTorch ignores; the lowering must agree.
    check_lowering(aten._fft_c2r.default, randn(3, 4, dtype=torch.complex64), [0, 1], 2,
                   last_dim_size, **TOL)


def test_an_unknown_normalization_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="FFT normalization mode 3"):
        check_lowering(aten._fft_c2c.default, randn(3, dtype=torch.complex64), [0], 3, True)


# ------------------------------------------------------------ torch.fft on the device

def test_rfft_and_irfft_round_trip_on_a_sharded_tensor():
    x = randn(8, 16)
    xs = x.to("spmd")
    mark_sharding(xs, Mesh(np.arange(8), (4, 2)), (0, 1))
    spectrum = torch.fft.rfft(xs, dim=0, norm="ortho")
    torch.testing.assert_close(spectrum.cpu(), torch.fft.rfft(x, dim=0, norm="ortho"), **TOL)
    torch.testing.assert_close(torch.fft.irfft(spectrum, n=8, dim=0, norm="ortho").cpu(), x,
                               **TOL)


def test_fftn_with_padding_and_trimming_matches_cpu():
    x = randn(4, 6, 5, dtype=torch.complex64)
    actual = torch.fft.fftn(x.to("spmd"), s=(6, 3), dim=(0, 2), norm="forward")
    torch.testing.assert_close(actual.cpu(), torch.fft.fftn(x, s=(6, 3), dim=(0, 2),
                                                            norm="forward"), **TOL)


def test_hfft_of_a_one_sided_spectrum_matches_cpu():
    z = randn(5, 4, dtype=torch.complex64)
    torch.testing.assert_close(torch.fft.hfft(z.to("spmd"), n=7).cpu(), torch.fft.hfft(z, n=7),
                               **TOL)
