"""``torch.func``'s transforms and ``torch.autograd.functional`` on spmd tensors match CPU."""

import pytest
import torch

from tests.step.helpers import DEVICE


def cube_sum(v):
    return (v ** 3).sum()


TRANSFORMS = {
    "grad": lambda t: torch.func.grad(lambda v: (v.sin() ** 2).sum())(t),
    "vmap": lambda t: torch.vmap(lambda row: row.dot(row))(t),
    "jacrev": lambda t: torch.func.jacrev(torch.sin)(t[0]),
    "jacfwd": lambda t: torch.func.jacfwd(torch.sin)(t[0]),
    # jacfwd over jacrev: PyTorch makes its zero tangents as efficient zero tensors,
    # a factory the spmd device lacked (a dispatcher error before).
    "hessian": lambda t: torch.func.hessian(cube_sum)(t[0]),
    "per-sample gradients": lambda t: torch.vmap(
        torch.func.grad(lambda w, row: (row @ w).sum()), in_dims=(None, 0))(
            torch.ones(4, device=t.device), t),
    "jacobian": lambda t: torch.autograd.functional.jacobian(torch.sin, t[0]),
    "hvp": lambda t: torch.autograd.functional.hvp(cube_sum, t[0], torch.ones_like(t[0]))[1],
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_transform_matches_cpu(name):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    expected = TRANSFORMS[name](x)
    torch.testing.assert_close(TRANSFORMS[name](x.to(DEVICE)).cpu(), expected)
