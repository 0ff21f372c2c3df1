"""``nn.LSTM``, ``nn.GRU`` and their cells on the device: PyTorch runs the fused cells
(``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell``) on any device but the CPU, and they
had no lowering. Outputs, the input's gradient and every parameter's gradient are
compared with CPU PyTorch, element by element."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torchspmd

DEV = torchspmd.device()


def _check(make, inputs, use=lambda out: out[0].sum() + out[1][0].sum()):
    torch.manual_seed(0)
    cpu = make()
    spmd = copy.deepcopy(cpu).to(DEV)
    results = []
    for model, dev in ((cpu, "cpu"), (spmd, DEV)):
        xs = [x.detach().clone().to(dev).requires_grad_() for x in inputs]
        out = model(*xs)
        (use(out) * 1.5).backward()
        results.append((out, [x.grad for x in xs], [p.grad for p in model.parameters()]))
    (want, want_x, want_p), (got, got_x, got_p) = results
    flat = lambda o: [t for t in (o if isinstance(o, tuple) else (o,)) for t in (t if isinstance(t, tuple) else (t,))]
    for g, w in zip(flat(got) + got_x + got_p, flat(want) + want_x + want_p):
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("layers, bidirectional, bias", [(1, False, True), (2, True, True),
                                                          (1, False, False)])
def test_recurrent_layers_match_cpu(kind, layers, bidirectional, bias):
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    _check(lambda: kind(4, 6, num_layers=layers, bidirectional=bidirectional, bias=bias,
                        batch_first=True), [x])


def test_only_the_output_sequence_used_matches_cpu():
    """The LSTM's last cell state gets no gradient (``grad_cy`` undefined)."""
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(2))
    _check(lambda: nn.LSTM(3, 5), [x], use=lambda out: out[0].square().sum())


@pytest.mark.parametrize("kind", [nn.LSTMCell, nn.GRUCell])
def test_cells_match_cpu(kind):
    g = torch.Generator().manual_seed(3)
    x, h = torch.randn(4, 3, generator=g), torch.randn(4, 5, generator=g)
    state = [h, torch.randn(4, 5, generator=g)] if kind is nn.LSTMCell else [h]

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = kind(3, 5)

        def forward(self, x, *state):
            out = self.cell(x, tuple(state) if len(state) > 1 else state[0])
            return out if isinstance(out, tuple) else (out, (out,))

    _check(Step, [x, *state])


def test_a_compiled_lstm_training_step_matches_cpu():
    torch.manual_seed(0)
    cpu = nn.LSTM(4, 6, batch_first=True)
    spmd = copy.deepcopy(cpu).to(DEV)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, spmd)]

    def step(model, opt, x):
        opt.zero_grad()
        loss = model(x)[0].square().mean()
        loss.backward()
        opt.step()
        return loss

    compiled = torchspmd.compile(lambda x: step(spmd, opts[1], x))
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        x = torch.randn(2, 5, 4, generator=g)
        want = step(cpu, opts[0], x)
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(spmd.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
