"""Training loops on the device reach CPU PyTorch's losses, compiling a fixed number of times."""

import pytest
import torch

import torchspmd
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.testing.models import MLP, TinyTransformer, batches, lm_loss, mse_loss, train

STEPS = 20


def _regression_data(steps):
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(16, 4, generator=g)
    inputs = [torch.randn(8, 16, generator=g) for _ in range(steps)]
    return [(x, x @ truth) for x in inputs]


def _train_both(model, data, loss_fn, lr):
    cpu = train(model, data, STEPS, "cpu", loss_fn=loss_fn, lr=lr)
    compiles = []
    spmd = train(model, data, STEPS, "spmd", loss_fn=loss_fn, lr=lr, sync=torchspmd.sync,
                 on_step=lambda step: compiles.append(COUNTERS["graphs_compiled"]))
    return cpu, spmd, compiles


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_training_matches_cpu_and_stops_compiling(name):
    torch.manual_seed(0)
    if name == "mlp":
        model, data, loss_fn, lr = MLP(), _regression_data(STEPS), mse_loss, 3e-2
    else:
        model, data, loss_fn, lr = TinyTransformer(), batches(64, 16, 4, STEPS), lm_loss, 3e-3
    cpu, spmd, compiles = _train_both(model, data, loss_fn, lr)
    torch.testing.assert_close(torch.tensor(spmd), torch.tensor(cpu), rtol=1e-4, atol=1e-6)
    assert compiles[-1] == compiles[2], compiles  # nothing compiles after step 3
    assert cpu[-1] < cpu[0]
