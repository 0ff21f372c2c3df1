"""``F.ctc_loss`` (``nn.CTCLoss``) and its gradient match CPU PyTorch: padded and
concatenated targets, every reduction, ``zero_infinity`` with an impossible alignment,
an empty input and an empty target, lengths on the CPU or the device, and the gradient
PyTorch defines for ``log_probs`` themselves (its formula, not the plain derivative).
``_ctc_loss`` had no lowering: CTC training (wav2vec2-style) failed on this device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEV = torchspmd.device()
T, N, C = 12, 3, 6


def _case(targets: str, zero_infinity: bool):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(T, N, C, generator=g)
    padded = torch.randint(1, C, (N, 4), generator=g)
    padded[1, :2] = 3  # a repeated label needs a blank between: 3 frames at least
    if zero_infinity:  # sequence 1 cannot align (2 frames), sequence 2 has no target
        inputs, lengths = torch.tensor([12, 2, 5]), torch.tensor([4, 2, 0])
    else:  # sequence 2 has no input at all
        inputs, lengths = torch.tensor([12, 9, 0]), torch.tensor([4, 2, 3])
    if targets == "concatenated":
        padded = torch.cat([padded[b, :lengths[b]] for b in range(N)])
    return logits, padded, inputs, lengths


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("targets", ["padded", "concatenated"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_and_the_logits_gradient_match_cpu(reduction, targets, zero_infinity):
    logits, target, inputs, lengths = _case(targets, zero_infinity)
    # CPU lengths work as on CUDA, except for "mean", which divides by them on the
    # loss's device (PyTorch's own device error, on CUDA too).
    for lengths_on in (["cpu", DEV] if reduction != "mean" else [DEV]):
        results = []
        for dev, where in (("cpu", "cpu"), (DEV, lengths_on)):
            x = logits.clone().to(dev).requires_grad_()
            loss = F.ctc_loss(x.log_softmax(2), target.to(dev), inputs.to(where),
                              lengths.to(where), reduction=reduction,
                              zero_infinity=zero_infinity)
            loss.sum().backward()
            results.append((loss.detach().cpu(), x.grad.cpu()))
        (want, want_grad), (got, got_grad) = results
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gradient_of_log_probs_is_pytorchs_formula(dtype):
    """PyTorch returns exp(log_probs) - posterior for log_probs, zero past each input's
    length: what a log-softmax before the loss turns into the logits' gradient."""
    logits, target, inputs, lengths = _case("padded", False)
    grads = []
    for dev in ("cpu", DEV):
        lp = logits.to(dtype).log_softmax(2).to(dev).requires_grad_()
        F.ctc_loss(lp, target.to(dev), inputs.to(dev), lengths.to(dev),
                   reduction="sum").backward()
        grads.append(lp.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)
    assert grads[1][9:, 1].abs().max() == 0  # sequence 1 has 9 frames


def test_a_compiled_ctc_training_step_with_a_sharded_batch_matches_cpu():
    mesh = torchspmd.Mesh(np.arange(8), (8,), ("data",))
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(8, 10, 5, generator=g)
    targets = torch.randint(1, 7, (8, 3), generator=g)
    inputs, lengths = torch.full((8,), 10), torch.randint(1, 4, (8,), generator=g)
    torch.manual_seed(0)
    cpu = torch.nn.Linear(5, 7)
    model = torch.nn.Linear(5, 7).to(DEV)
    model.load_state_dict(cpu.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, model)]

    def step(m, opt, x, y, il, tl):
        opt.zero_grad()
        lp = m(x).log_softmax(-1).transpose(0, 1)
        loss = F.ctc_loss(lp, y, il, tl)
        loss.backward()
        opt.step()
        return loss

    compiled = torchspmd.compile(step)
    x = feats.to(DEV)
    torchspmd.mark_sharding(x, mesh, ("data", None, None))
    for _ in range(3):
        want = step(cpu, opts[0], feats, targets, inputs, lengths)
        got = compiled(model, opts[1], x, targets.to(DEV), inputs.to(DEV), lengths.to(DEV))
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.weight.detach().cpu(), cpu.weight.detach(), rtol=1e-5,
                               atol=1e-6)
