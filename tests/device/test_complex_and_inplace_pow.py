"""Complex numbers built from real parts, and in-place powers, compute what CPU PyTorch does.

``torch.complex``/``torch.polar`` and ``z.real``/``z.imag`` write through views made by
``view_as_real``; ``x.pow_(2.0)``, ``x **= 2`` and ``float_power_`` are recorded as their
functional overloads.
"""

import pytest
import torch

A = torch.tensor([1.0, 2.0, 3.0])
B = torch.tensor([4.0, -5.0, 0.5])


def test_torch_complex_pairs_real_and_imaginary_parts():
    out = torch.complex(A.to("spmd"), B.to("spmd"))
    assert torch.equal(out.cpu(), torch.complex(A, B))


def test_torch_polar_builds_from_magnitude_and_angle():
    out = torch.polar(A.to("spmd"), B.to("spmd"))
    torch.testing.assert_close(out.cpu(), torch.polar(A, B))


def test_scaling_the_real_part_changes_the_complex_tensor():
    cpu = torch.complex(A, B)
    z = cpu.to("spmd")
    cpu.real.mul_(2)
    z.real.mul_(2)
    assert torch.equal(z.cpu(), cpu)


def test_zeroing_the_imaginary_part_changes_the_complex_tensor():
    cpu = torch.complex(A, B)
    z = cpu.to("spmd")
    cpu.imag.zero_()
    z.imag.zero_()
    assert torch.equal(z.cpu(), cpu)


def test_writing_through_view_as_complex_changes_the_real_base():
    cpu = torch.arange(6.0).reshape(3, 2)
    x = cpu.to("spmd")
    torch.view_as_complex(cpu).mul_(1j)
    torch.view_as_complex(x).mul_(1j)
    assert torch.equal(x.cpu(), cpu)


def test_writing_through_a_dtype_view_changes_the_bits_of_the_base():
    cpu = torch.arange(4.0)
    x = cpu.to("spmd")
    cpu.view(torch.int32).add_(1)
    x.view(torch.int32).add_(1)
    assert torch.equal(x.cpu(), cpu)


def test_writing_through_an_expanded_view_of_view_as_real_raises_clearly():
    z = torch.complex(A, B).to("spmd")
    view = torch.view_as_real(z).unsqueeze(0).expand(1, 3, 2)
    with pytest.raises(NotImplementedError, match="view_as_real"):
        view.add_(1)


@pytest.mark.parametrize("name, update", [
    ("pow_ float", lambda t: t.pow_(2.0)),
    ("pow_ int", lambda t: t.pow_(3)),
    ("**=", lambda t: t.__ipow__(2)),
    ("pow_ tensor", lambda t: t.pow_(torch.tensor([2.0, 0.5, 3.0], device=t.device))),
    ("float_power_ scalar", lambda t: t.float_power_(2)),
    ("float_power_ tensor",
     lambda t: t.float_power_(torch.tensor([2.0, 0.5, 3.0], dtype=torch.float64, device=t.device))),
])
def test_inplace_power_matches_cpu(name, update):
    dtype = torch.float64 if name.startswith("float_power") else torch.float32
    cpu = torch.tensor([1.5, 2.0, 3.0], dtype=dtype)
    x = cpu.to("spmd")
    update(cpu)
    update(x)
    torch.testing.assert_close(x.cpu(), cpu)
