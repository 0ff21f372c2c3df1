"""A host read refused inside a compiled step says where PyTorch's own code read, and
what keeps the value on the device, when the read is inside ``GradScaler`` or an
optimizer (the user's line is a ``scaler.step(opt)`` or ``opt.step()`` that reads nothing
itself). A read in the user's own code gets the generic advice only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchspmd
from torchspmd.step import HostReadInStep

DEV = torchspmd.device()


def _compiled_step(opt_of, scaled: bool = False):
    model = nn.Linear(6, 3).to(DEV)
    opt = opt_of(model.parameters())
    scaler = torch.amp.GradScaler("spmd")

    @torchspmd.compile
    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        (scaler.scale(loss) if scaled else loss).backward()
        if scaled:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    def run():
        for _ in range(2):  # the first call may run as a warm-up
            step(torch.randn(5, 6).to(DEV))
    return run


def test_grad_scaler_step_with_an_unfused_optimizer_names_the_fused_ones():
    run = _compiled_step(lambda p: torch.optim.SGD(p, lr=0.1), scaled=True)
    with pytest.raises(HostReadInStep, match=r"grad_scaler\.py:\d+.*fused=True"):
        run()


def test_the_same_scaled_step_with_a_fused_optimizer_compiles():
    _compiled_step(lambda p: torch.optim.SGD(p, lr=0.1, fused=True), scaled=True)()


def test_an_optimizer_reading_on_the_host_names_foreach():
    run = _compiled_step(lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=False))
    with pytest.raises(HostReadInStep, match=r"optim/adagrad\.py:\d+.*foreach=True"):
        run()


@pytest.mark.skipif(not hasattr(torch.optim, "Adafactor"), reason="torch.optim.Adafactor is newer")
def test_an_optimizer_whose_algorithm_reads_says_to_step_after_the_compiled_function():
    run = _compiled_step(lambda p: torch.optim.Adafactor(p, lr=0.01))
    with pytest.raises(HostReadInStep, match="Adafactor's update reads .* after the compiled"):
        run()


def test_a_read_in_the_users_own_code_gets_no_library_hint():
    @torchspmd.compile
    def step(x):
        return (x * 2).sum().item()

    with pytest.raises(HostReadInStep) as error:
        for _ in range(2):
            step(torch.ones(3).to(DEV))
    assert "The read is in" not in str(error.value)


def test_an_averaged_model_updated_in_the_step_says_to_update_it_after():
    """``AveragedModel.update_parameters`` branches on its count on the host."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model = nn.Linear(6, 3).to(DEV)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), device=DEV)
    step = torchspmd.compile(lambda: ema.update_parameters(model))
    with pytest.raises(HostReadInStep, match=r"swa_utils\.py:\d+ \(update_parameters\).*after the"):
        step()


def test_clipping_that_raises_on_a_non_finite_norm_says_to_check_the_norm_after():
    model = nn.Linear(6, 3).to(DEV)

    @torchspmd.compile
    def step(x):
        model(x).sum().backward()
        return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)

    with pytest.raises(HostReadInStep, match="clip_grad_norm_.*error_if_nonfinite False"):
        for _ in range(2):
            step(torch.ones(2, 6).to(DEV))
