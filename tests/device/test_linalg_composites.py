"""Linear algebra through the spmd device: errors, the factored matrix, and gradients as on CPU.

``linalg.inv``/``cholesky``/``solve`` raise CPU PyTorch's error on a singular or
non-positive-definite input (reading ``info`` once on the host); the ``*_ex`` variants
return ``info`` instead. ``solve``/``det``/``slogdet`` factor ``A`` or ``A.mT`` as PyTorch
does, so their backward formulas, which reuse that factorization, give CPU's gradients.
"""

import numpy as np
import pytest
import torch

import torchspmd as xs
from torchspmd.step import HostReadInStep

g = torch.Generator().manual_seed(0)


def r(*shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def spd(n):
    a = r(n, n)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


def singular():
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 5.0]], dtype=torch.float64)
    return a


def _cpu_error(fn, a):
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        fn(a)
    return str(cpu.value)


@pytest.mark.parametrize("fn", [torch.linalg.inv, lambda a: torch.linalg.solve(a, a[:, :1])],
                         ids=["inv", "solve"])
def test_singular_input_raises_cpu_error(fn):
    message = _cpu_error(fn, singular())
    with pytest.raises(torch.linalg.LinAlgError) as dev:
        fn(singular().to("spmd"))
    assert str(dev.value) == message


def test_cholesky_of_indefinite_matrix_raises_cpu_error():
    a = -spd(3)
    message = _cpu_error(torch.linalg.cholesky, a)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite") as dev:
        torch.linalg.cholesky(a.to("spmd"))
    assert str(dev.value) == message


def test_legacy_cholesky_raises_too():
    with pytest.raises(torch.linalg.LinAlgError, match="cholesky"):
        torch.cholesky(-spd(3).to("spmd"))


def test_ex_variant_returns_info_instead_of_raising():
    inverse, info = torch.linalg.inv_ex(singular().to("spmd"))
    assert info.device.type == "spmd"
    assert info.cpu().item() == torch.linalg.inv_ex(singular()).info.item() > 0


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed_view"])
def test_solve_det_slogdet_match_cpu(transposed):
    a, b = r(2, 4, 4), r(2, 4, 3)
    a_dev = a.to("spmd")
    if transposed:  # non-contiguous: PyTorch factors A itself instead of A.mT
        a, a_dev = a.mT, a_dev.mT
    torch.testing.assert_close(torch.linalg.solve(a_dev, b.to("spmd")).cpu(), torch.linalg.solve(a, b))
    torch.testing.assert_close(torch.linalg.det(a_dev).cpu(), torch.linalg.det(a))
    sign, logabs = torch.linalg.slogdet(a_dev)
    torch.testing.assert_close((sign.cpu(), logabs.cpu()), tuple(torch.linalg.slogdet(a)))


@pytest.mark.parametrize("op", [torch.ops.aten._linalg_det.default, torch.ops.aten._linalg_slogdet.default,
                                torch.ops.aten._linalg_solve_ex.default], ids=["det", "slogdet", "solve"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed_view"])
def test_factorization_handed_to_backward_is_cpus(op, transposed):
    a, b = r(4, 4), r(4, 2)
    a_dev = a.to("spmd")
    if transposed:
        a, a_dev = a.mT, a_dev.mT
    args = (b,) if op == torch.ops.aten._linalg_solve_ex.default else ()
    expected = op(a, *args)
    actual = op(a_dev, *(x.to("spmd") for x in args))
    for x, e in zip(actual, expected):
        torch.testing.assert_close(x.cpu(), e)


def test_solve_with_vector_right_hand_side():
    a, b = r(3, 4, 4), r(3, 4)
    torch.testing.assert_close(torch.linalg.solve(a.to("spmd"), b.to("spmd")).cpu(),
                               torch.linalg.solve(a, b))


def _lstsq_matches_cpu(a, b, **kwargs):
    expected = torch.linalg.lstsq(a, b, **kwargs)
    actual = torch.linalg.lstsq(a.to("spmd"), b.to("spmd"), **kwargs)
    for x, e in zip(actual, expected):
        torch.testing.assert_close(x.cpu(), e)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss", "gels"])
@pytest.mark.parametrize("shape", [(2, 5, 3), (3, 5)], ids=["tall_batch", "wide"])
def test_lstsq_matches_cpu_for_each_driver(driver, shape):
    a = r(*shape)
    _lstsq_matches_cpu(a, r(*shape[:-1], 2), driver=driver)


def test_lstsq_with_vector_right_hand_side():
    _lstsq_matches_cpu(r(2, 5, 3), r(2, 5), driver="gelsd")


@pytest.mark.parametrize("driver", ["gelsy", "gelsd"])
def test_lstsq_of_complex_input_has_real_residuals_and_singular_values(driver):
    a = torch.complex(r(5, 3), r(5, 3))
    _lstsq_matches_cpu(a, torch.complex(r(5, 2), r(5, 2)), driver=driver)


def test_lstsq_rank_deficient_input_has_no_residuals():
    a = r(5, 3)
    a[:, 2] = 2 * a[:, 0]
    _lstsq_matches_cpu(a, r(5, 2), driver="gelsd")


def test_lstsq_gels_on_rank_deficient_input_raises_like_cpu():
    a = r(5, 3)
    a[:, 2] = 0
    with pytest.raises(torch.linalg.LinAlgError, match="does not have full rank"):
        torch.linalg.lstsq(a.to("spmd"), r(5, 2).to("spmd"), driver="gels")


def test_lstsq_unknown_driver_is_an_error():
    with pytest.raises(RuntimeError, match="driver"):
        torch.linalg.lstsq(r(3, 3).to("spmd"), r(3, 1).to("spmd"), driver="gesv")


def _positive_definite(x):
    return torch.linalg.cholesky(x @ x.mT + 4 * torch.eye(4, dtype=x.dtype, device=x.device))


def _grad(fn, a, device):
    x = (a.to(device) if device == "spmd" else a.clone()).requires_grad_(True)
    fn(x).backward()
    return x.grad.cpu()


GRADIENTS = {
    "det": lambda x: torch.linalg.det(x).sum(),
    "det_transposed": lambda x: torch.linalg.det(x.mT).sum(),
    "slogdet": lambda x: torch.linalg.slogdet(x)[1].sum(),
    "solve": lambda x: torch.linalg.solve(x, torch.ones(4, 2, dtype=x.dtype, device=x.device)).sum(),
    "solve_transposed": lambda x: torch.linalg.solve(
        x.mT, torch.ones(4, 2, dtype=x.dtype, device=x.device)).pow(2).sum(),
    "inv": lambda x: torch.linalg.inv(x).sin().sum(),
    "cholesky": lambda x: _positive_definite(x).sum(),
    "eigvalsh": lambda x: torch.linalg.eigvalsh(x + x.mT).pow(2).sum(),
    "svdvals": lambda x: torch.linalg.svdvals(x).sum(),
    "lstsq": lambda x: torch.linalg.lstsq(x[..., :3], torch.ones(2, 4, 2, dtype=x.dtype, device=x.device),
                                          driver="gelsd").solution.sum(),
    "qr_r": lambda x: torch.linalg.qr(x).R.abs().sum(),
}


@pytest.mark.parametrize("name", GRADIENTS)
def test_gradient_matches_cpu(name):
    a = r(2, 4, 4) + 3 * torch.eye(4, dtype=torch.float64)
    fn = GRADIENTS[name]
    torch.testing.assert_close(_grad(fn, a, "spmd"), _grad(fn, a, "cpu"))


SHARDED = {
    "inv": torch.linalg.inv,
    "cholesky": _positive_definite,
    "eigvalsh": lambda x: torch.linalg.eigvalsh(x + x.mT),
    "svdvals": torch.linalg.svdvals,
    "ldl_factor": lambda x: torch.linalg.ldl_factor(x + x.mT).LD,
    "lu_solve": lambda x: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), x[..., :2]),
}


@pytest.mark.parametrize("name", SHARDED)
def test_batch_sharded_over_the_mesh_matches_cpu(name):
    mesh = xs.Mesh(np.arange(8), (8,), ("batch",))
    a = r(8, 4, 4)
    x = a.to("spmd")
    xs.mark_sharding(x, mesh, ("batch", None, None))
    torch.testing.assert_close(SHARDED[name](x).cpu(), SHARDED[name](a))


def test_error_check_is_refused_inside_a_compiled_step():
    """Raising on a singular input reads ``info`` on the host, which a captured step cannot."""
    a = r(3, 3)
    inverse, _ = xs.compile(torch.linalg.inv_ex)(a.to("spmd"))  # returns info, reads nothing
    torch.testing.assert_close(inverse.cpu(), torch.linalg.inv(a))
    with pytest.raises(HostReadInStep, match="to check that the factorization succeeded"):
        xs.compile(torch.linalg.inv)(a.to("spmd"))
