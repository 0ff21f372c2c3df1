"""``torch.optim`` with ``fused=True`` (Adam, AdamW, SGD, Adagrad) trains on the spmd
device as PyTorch's fused CPU kernels train on the CPU: every element of every parameter,
gradient and state tensor after each step. Their kernels had no lowering (CUDA users'
scripts failed at the first ``opt.step()``).

A fused optimizer takes ``GradScaler``'s scale and ``found_inf`` into its kernel, so a
scaled step needs no host read: scale, backward, ``scaler.step``, ``scaler.update`` compile
whole into one ``torchspmd.compile`` program (PyTorch/XLA's ``syncfree`` optimizers), and a
step with an inf gradient is skipped there as on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchspmd

DEV = torchspmd.device()

CASES = {
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam wd amsgrad maximize": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1,
                                                        amsgrad=True, maximize=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05, betas=(0.8, 0.95))),
    "adamw amsgrad": (torch.optim.AdamW, dict(lr=0.01, amsgrad=True)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd momentum nesterov wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True,
                                                       weight_decay=0.01)),
    "sgd momentum dampening maximize": (torch.optim.SGD, dict(lr=0.1, momentum=0.5,
                                                              dampening=0.3, maximize=True)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01)),
}


def _model(dev: str | torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dev)


def _batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def _assert_same_training(cpu_model, cpu_opt, model, opt) -> None:
    for p, q in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)
    for key, state in cpu_opt.state_dict()["state"].items():
        got = opt.state_dict()["state"][key]
        assert got.keys() == state.keys()
        for name, value in state.items():
            other = got[name]
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(other.cpu(), value, rtol=1e-5, atol=1e-6)
            else:
                assert other == value, name


@pytest.mark.parametrize("case", list(CASES))
def test_fused_steps_match_the_cpu_kernels(case):
    cls, kwargs = CASES[case]
    cpu_model, model = _model("cpu"), _model(DEV)
    cpu_opt = cls(cpu_model.parameters(), fused=True, **kwargs)
    opt = cls(model.parameters(), fused=True, **kwargs)
    for x, y in _batches(4):
        for m, o, dev in ((cpu_model, cpu_opt, "cpu"), (model, opt, DEV)):
            o.zero_grad()
            (m(x.to(dev)) - y.to(dev)).square().mean().backward()
            o.step()
        _assert_same_training(cpu_model, cpu_opt, model, opt)


def _bf16_training(dev, cls, fused: bool, **kwargs):
    torch.manual_seed(0)
    model = nn.Linear(16, 3).to(dev).to(torch.bfloat16)
    opt = cls(model.parameters(), fused=fused, foreach=None if fused else False, **kwargs)
    for x, _ in _batches(3):
        x = torch.nn.functional.pad(x, (0, 10)).to(torch.bfloat16).to(dev)
        opt.zero_grad()
        model(x).float().square().mean().backward()
        opt.step()
    return ([p.detach().cpu() for p in model.parameters()]
            + [v.cpu() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])


def test_bfloat16_parameters_compute_in_float32_as_the_cpu_kernel():
    got = _bf16_training(DEV, torch.optim.AdamW, True, lr=0.01, weight_decay=0.1)
    want = _bf16_training("cpu", torch.optim.AdamW, True, lr=0.01, weight_decay=0.1)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_bfloat16_sgd_with_momentum_matches_the_unfused_cpu_optimizer():
    """PyTorch 2.13's fused CPU SGD leaves whole SIMD blocks of bfloat16 parameters
    un-updated and reads their momentum buffers as float32 (pytorch/pytorch#191763): the
    reference here is the unfused optimizer, whose math the fused kernel is meant to do."""
    got = _bf16_training(DEV, torch.optim.SGD, True, lr=0.1, momentum=0.9)
    want = _bf16_training("cpu", torch.optim.SGD, False, lr=0.1, momentum=0.9)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_a_new_learning_rate_every_step_compiles_nothing():
    """A scheduler changes ``lr`` every step: the fused op takes it as a value."""
    model = _model(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    cpu_model = _model("cpu")
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9, fused=True)
    cpu_schedule = torch.optim.lr_scheduler.StepLR(cpu_opt, step_size=1, gamma=0.5)
    compiled = []
    for x, y in _batches(5):
        for m, o, s, dev in ((cpu_model, cpu_opt, cpu_schedule, "cpu"),
                             (model, opt, schedule, DEV)):
            o.zero_grad()
            (m(x.to(dev)) - y.to(dev)).square().mean().backward()
            o.step()
            s.step()
        before = torchspmd.metrics()["graphs_compiled"]
        torchspmd.sync()
        compiled.append(torchspmd.metrics()["graphs_compiled"] - before)
    assert compiled[2:] == [0, 0, 0]  # the first step (momentum buffers new) and the next
    _assert_same_training(cpu_model, cpu_opt, model, opt)


def test_lists_of_different_lengths_raise_pytorchs_error():
    a = [torch.zeros(2).to(DEV), torch.zeros(3).to(DEV)]
    with pytest.raises(RuntimeError, match="momentum_buffer_list has 1 tensors, expected 2"):
        torch._fused_sgd_(a, a, a[:1], weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0,
                          nesterov=False, maximize=False, is_first_step=False)


def test_a_sharded_parameter_keeps_its_sharding_through_a_fused_step():
    mesh = torchspmd.Mesh(np.arange(8), (4, 2), ("data", "model"))
    model, cpu_model = _model(DEV), _model("cpu")
    torchspmd.mark_sharding(model[0].weight, mesh, ("model", None))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.01, fused=True)
    for x, y in _batches(3):
        for m, o, dev in ((cpu_model, cpu_opt, "cpu"), (model, opt, DEV)):
            o.zero_grad()
            (m(x.to(dev)) - y.to(dev)).square().mean().backward()
            o.step()
    _assert_same_training(cpu_model, cpu_opt, model, opt)
    assert torchspmd.get_sharding(model[0].weight) == torchspmd.get_sharding(
        model[0].weight.detach())
    assert "devices=[2,1,4]" in torchspmd.get_sharding(model[0].weight)


# --- GradScaler: sync-free inside a compiled step -------------------------------------

def _scaled_training(dev, compiled: bool, blowups=(2,), cls=torch.optim.AdamW):
    model = _model(dev)
    opt = cls(model.parameters(), lr=0.01, fused=True)
    scaler = torch.amp.GradScaler("cpu" if dev == "cpu" else "spmd", init_scale=2.0 ** 8,
                                  growth_interval=2)

    def step(x, y):
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    run = torchspmd.compile(step) if compiled else step
    losses, scales = [], []
    for i, (x, y) in enumerate(_batches(7)):
        if i in blowups:
            x = x.clone()
            x[0, 0] = float("inf")
        losses.append(run(x.to(dev), y.to(dev)).detach())
        scales.append(scaler.get_scale())
    return model, opt, [v.item() for v in losses], scales


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.SGD])
def test_a_scaled_step_compiles_whole_and_skips_an_inf_step_as_the_cpu(cls):
    cpu_model, cpu_opt, cpu_losses, cpu_scales = _scaled_training("cpu", False, cls=cls)
    before = torchspmd.metrics()
    model, opt, losses, scales = _scaled_training(DEV, True, cls=cls)
    after = torchspmd.metrics()
    assert scales == cpu_scales  # backed off after the inf step, grown every 2 good ones
    np.testing.assert_allclose(losses, cpu_losses, rtol=1e-5)
    _assert_same_training(cpu_model, cpu_opt, model, opt)
    assert after["step_replays"] - before["step_replays"] >= 4  # no host read refused it


def test_a_scaled_step_with_inf_on_its_first_call_matches_the_cpu():
    cpu_model, cpu_opt, _, cpu_scales = _scaled_training("cpu", False, blowups=(0, 3, 4))
    model, opt, _, scales = _scaled_training(DEV, True, blowups=(0, 3, 4))
    assert scales == cpu_scales
    _assert_same_training(cpu_model, cpu_opt, model, opt)


def test_scaled_accumulation_with_unscale_and_clipping_compiles_and_matches_cpu():
    """Two compiled functions: micro-steps that scale and accumulate, and an update that
    unscales, clips, steps a fused optimizer through the scaler and updates the scale;
    one micro-batch holds a NaN (that update is skipped, the scale backs off)."""
    def run(dev, compiled: bool):
        model = _model(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, fused=True)
        scaler = torch.amp.GradScaler("cpu" if dev == "cpu" else "spmd", init_scale=2.0 ** 10,
                                      growth_interval=3)

        def micro(x, y):
            loss = (model(x) - y).square().mean() / 2
            scaler.scale(loss).backward()
            return loss

        def update():
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return norm

        if compiled:
            micro, update = torchspmd.compile(micro), torchspmd.compile(update)
        seen = []
        batches = _batches(10)
        for i in range(5):
            for x, y in batches[2 * i:2 * i + 2]:
                if i == 2:
                    x = x.clone()
                    x[1, 1] = float("nan")
                micro(x.to(dev), y.to(dev))
            seen.append((update().item(), scaler.get_scale()))
        return model, opt, seen

    cpu_model, cpu_opt, want = run("cpu", False)
    model, opt, got = run(DEV, True)
    assert [s for _, s in got] == [s for _, s in want] == [1024.0] * 2 + [512.0] * 3
    np.testing.assert_allclose([n for n, _ in got], [n for n, _ in want], rtol=1e-5)
    for p, q in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
