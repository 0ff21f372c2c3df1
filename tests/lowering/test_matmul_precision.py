"""float32 matmuls follow ``torch.set_float32_matmul_precision``, as on CUDA.

- "highest" (PyTorch's default) asks XLA for full float32 precision; "high" for XLA's
  HIGH and "medium" for its DEFAULT (TF32 on NVIDIA GPUs); float64 stays at full precision;
- the setting is part of a graph's key: changing it compiles anew, on the lazy path and
  for a compiled step, and setting it back reuses the first program.
"""

import pytest
import torch

import torchspmd as xs
from torchspmd.debug import last_hlo


@pytest.fixture
def setting():
    """Sets torch's float32 matmul precision for one test, then restores it."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _matmul_precision(dtype=torch.float32) -> str:
    a = torch.randn(8, 8, dtype=dtype).to(xs.device())
    (a @ a).cpu()
    dots = [line for line in last_hlo().splitlines() if " dot(" in line]
    assert dots, last_hlo()
    return dots[0].split("operand_precision={")[1].split(",")[0] if "operand_precision" in dots[0] else "default"


@pytest.mark.parametrize("torch_setting, xla", [("highest", "highest"), ("high", "high"),
                                                ("medium", "default")])
def test_float32_matmuls_take_torchs_setting(setting, torch_setting, xla):
    setting(torch_setting)
    assert _matmul_precision() == xla


def test_float64_matmuls_stay_at_full_precision(setting):
    setting("medium")
    assert _matmul_precision(torch.float64) == "highest"


def test_changing_the_setting_compiles_anew_and_going_back_reuses(setting):
    a, b = torch.randn(7, 5).to(xs.device()), torch.randn(5, 3).to(xs.device())  # shapes of its own
    (a @ b).cpu()
    xs.reset_metrics()
    setting("high")
    (a @ b).cpu()
    assert xs.metrics()["graphs_compiled"] == 1
    setting("highest")
    (a @ b).cpu()
    assert xs.metrics()["graphs_compiled"] == 1  # the first program again


def test_a_compiled_step_is_captured_again_under_a_new_setting(setting):
    w = torch.randn(8, 8).to(xs.device())
    step = xs.compile(lambda x: x @ w)
    x = torch.randn(8, 8)
    step(x.to(xs.device())).cpu()
    step(x.to(xs.device())).cpu()
    captures = xs.metrics()["step_captures"]
    setting("high")
    torch.testing.assert_close(step(x.to(xs.device())).cpu(), x @ w.cpu())
    assert xs.metrics()["step_captures"] == captures + 1
    assert "operand_precision={high,high}" in step.optimized_hlo()
