"""An spmd tensor answers Python's number and formatting protocols as a CPU tensor does.

Training loops log with f-strings (``f"loss {loss:.4f}"``), collect losses in lists and
turn them into one tensor (``torch.tensor(losses)``), and log a learning rate held as a
0-d spmd tensor. Each reads the number from the device, as it would from a CUDA tensor.
"""

import pytest
import torch

import torchspmd
from tests.step.helpers import DEVICE, mlp, train_step

VALUES = [torch.tensor(2.5), torch.tensor(3), torch.tensor(-1.25, dtype=torch.float64)]


@pytest.mark.parametrize("spec", ["", ".4f", ".2e", ">10", "+.1%"])
@pytest.mark.parametrize("value", VALUES, ids=str)
def test_a_scalar_formats_as_its_number(value, spec):
    assert format(value.to(DEVICE), spec) == format(value, spec)


def test_a_scalar_with_autograd_history_formats_without_a_warning(recwarn):
    loss = (torch.ones(3, device=DEVICE, requires_grad=True) * 2).sum()
    assert f"{loss:.3f}" == "6.000"
    assert not [w for w in recwarn if "requires_grad" in str(w.message)]


def test_a_tensor_with_elements_formats_as_its_text():
    t = torch.arange(3.0)
    assert f"{t.to(DEVICE)}" == f"{t}"[:-1] + ", device='spmd:0')"
    with pytest.raises(TypeError):
        f"{t.to(DEVICE):.2f}"  # as on CPU: only a 0-d tensor takes a number's format


@pytest.mark.parametrize("make", [torch.tensor, torch.as_tensor], ids=["tensor", "as_tensor"])
def test_a_list_of_scalars_becomes_one_cpu_tensor(make):
    losses = [torch.tensor(v) for v in (0.5, 0.25, 0.125)]
    got = make([loss.to(DEVICE) for loss in losses])
    torch.testing.assert_close(got, make(losses))


def test_a_learning_rate_held_as_a_device_scalar_logs_as_a_number():
    model = mlp(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(3e-4, device=DEVICE))
    step = torchspmd.compile(train_step(model, opt))
    for _ in range(2):
        step(torch.randn(16, 8).to(DEVICE), torch.randn(16, 4).to(DEVICE))
    lr = opt.param_groups[0]["lr"]
    assert f"lr {lr:.1e}" == "lr 3.0e-04"
    assert float(lr) == pytest.approx(3e-4)


@pytest.mark.parametrize("consumer", ["torch.from_dlpack", "numpy", "jax"])
def test_dlpack_is_refused_with_the_way_to_run_jax_on_the_tensor(consumer):
    import jax
    import numpy as np

    take = {"torch.from_dlpack": torch.from_dlpack, "numpy": np.from_dlpack,
            "jax": jax.dlpack.from_dlpack}[consumer]
    with pytest.raises(TypeError, match="call_jax"):
        take(torch.ones(3, device=DEVICE))
