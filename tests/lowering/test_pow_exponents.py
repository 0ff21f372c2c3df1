"""A power's exponent (``lazy/schema.SPECIAL_EXPONENTS``): the exponents PyTorch's CPU
kernel computes otherwise than a general power (squares, cubes, reciprocals, square
roots) are constants of the program, computed as PyTorch computes them; any other
exponent is data, so a changing one shares the program."""

import pytest
import torch

import torchspmd
from torchspmd.debug import last_hlo

DEV = torchspmd.device()
EDGES = torch.tensor([-float("inf"), -2.0, -1.0, -0.0, 0.0, 0.3, 1.0, 2.0, float("inf"),
                      float("nan")])


@pytest.mark.parametrize("exponent", [2, 3, -1, -2, 0, 1, 0.5, -0.5, 2.0, 4, 1.7, -3])
def test_powers_equal_cpus_at_the_edges(exponent):
    got, want = EDGES.to(DEV).pow(exponent).cpu(), EDGES.pow(exponent)
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))  # nan where CPU has nan


def test_a_square_is_a_multiply_not_a_general_power():
    x = torch.randn(4, 8)
    assert torch.equal(x.to(DEV).pow(2).cpu(), x.pow(2))  # x * x: exact, as on the CPU
    assert " power(" not in last_hlo()


def test_another_exponent_each_call_shares_one_program():
    x = torch.rand(16) + 0.5
    (x.to(DEV) ** 1.3).cpu()
    torchspmd.reset_metrics()
    for exponent in (1.4, 2.7, 0.9):
        torch.testing.assert_close((x.to(DEV) ** exponent).cpu(), x ** exponent)
    assert torchspmd.metrics()["graphs_compiled"] == 0
