"""``torch.amp.GradScaler("spmd")`` trains as ``GradScaler("cpu")`` does: gradients
unscaled, a step with an inf or NaN gradient skipped and the scale backed off, the scale
grown after ``growth_interval`` good steps. Its two kernels had no implementation on
this device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchspmd

DEV = torchspmd.device()


def _train(dev, blowups=(2,)):
    torch.manual_seed(0)
    model = nn.Linear(4, 3).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu" if dev == "cpu" else "spmd", init_scale=2.0 ** 8,
                                  growth_interval=2)
    scales = []
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        x = torch.randn(5, 4, generator=g).to(dev)
        opt.zero_grad()
        loss = model(x).square().mean() * (float("inf") if i in blowups else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


@pytest.mark.parametrize("blowups", [(), (2,), (0, 1, 4)])
def test_scaled_training_matches_cpu(blowups):
    want_params, want_scales = _train("cpu", blowups)
    params, scales = _train(DEV, blowups)
    assert scales == want_scales
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_unscale_marks_a_non_finite_gradient_and_scales_every_one():
    grads = [torch.ones(2).to(DEV), torch.tensor([4.0, float("nan")]).to(DEV)]
    found = torch.zeros(1).to(DEV)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 0.5).to(DEV))
    assert grads[0].cpu().tolist() == [0.5, 0.5] and grads[1].cpu()[0].item() == 2.0
    assert found.cpu().tolist() == [1.0]


def test_a_compiled_forward_and_backward_with_the_scaler_stepping_outside_matches_cpu():
    """``scaler.step`` reads ``found_inf`` on the host: it goes after the compiled call."""
    def run(dev, compiled):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu" if dev == "cpu" else "spmd", init_scale=256.0,
                                      growth_interval=2)

        def forward_backward(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            scaler.scale(loss).backward()
            return loss

        step = torchspmd.compile(forward_backward) if compiled else forward_backward
        g = torch.Generator().manual_seed(1)
        for i in range(5):
            step((torch.randn(5, 4, generator=g) * (float("inf") if i == 2 else 1.0)).to(dev))
            scaler.step(opt)
            scaler.update()
        return [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    (want, want_scale), (got, scale) = run("cpu", False), run(DEV, True)
    assert scale == want_scale
    for p, q in zip(got, want):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_a_scale_made_inside_a_compiled_step_is_state_that_later_calls_read():
    """GradScaler makes its scale on its first ``scale()``. Made inside a captured step, it
    was an op of the program (PyTorch objects other than modules and optimizers were not
    walked), so every replay scaled by the initial scale, whatever ``update()`` set: after
    a backoff, the gradients came out twice too large."""
    def grads(compiled: bool):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).to(DEV)
        scaler = torch.amp.GradScaler("spmd", init_scale=1024.0)

        def micro(x):
            scaler.scale(model(x).square().mean()).backward()

        run = torchspmd.compile(micro) if compiled else micro
        seen = []
        for i in range(4):
            model.zero_grad()
            run(torch.ones(2, 4).to(DEV) * (i + 1))
            seen.append(model.weight.grad.cpu())
            if i == 1:
                scaler.update(new_scale=512.0)
        return seen

    for got, want in zip(grads(True), grads(False)):
        torch.testing.assert_close(got, want)
