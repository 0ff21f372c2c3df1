"""Ops are recorded; graphs run at sync or when a value is needed, and are cached."""

import torch

import torchspmd
from torchspmd.runtime.metrics import COUNTERS


def _delta(before):
    return {k: COUNTERS[k] - before[k] for k in before}


def test_nothing_runs_until_a_value_is_needed():
    x = torch.ones(4, device="spmd")
    before = dict(COUNTERS)
    y = (x * 3 + 1).exp()
    assert _delta(before)["executions"] == 0
    y.cpu()
    assert _delta(before)["executions"] == 1


def test_sync_runs_every_pending_tensor():
    x = torch.ones(4, device="spmd")
    a, b = x + 1, x * 5
    before = dict(COUNTERS)
    torchspmd.sync()
    assert _delta(before)["executions"] == 1
    before = dict(COUNTERS)
    assert torch.equal(a.cpu(), torch.full((4,), 2.0))
    assert torch.equal(b.cpu(), torch.full((4,), 5.0))
    assert _delta(before)["executions"] == 0  # already computed


def _step(x, lr):
    return (x * lr + 1).sum()


def test_same_graph_again_hits_the_cache():
    x = torch.randn(8, device="spmd")
    torchspmd.sync()  # a read runs all pending work: x's own graph must not be part of it
    _step(x, 0.1).cpu()
    before = dict(COUNTERS)
    _step(x, 0.1).cpu()
    assert _delta(before)["graphs_compiled"] == 0
    assert _delta(before)["cache_hits"] == 1


def test_changing_python_numbers_does_not_recompile():
    x = torch.randn(8, device="spmd")
    torchspmd.sync()  # a read runs all pending work: x's own graph must not be part of it
    _step(x, 0.1).cpu()
    before = dict(COUNTERS)
    value = _step(x, 0.25).cpu()
    assert _delta(before)["graphs_compiled"] == 0
    torch.testing.assert_close(value, _step(x.cpu(), 0.25))


def test_metrics_count_transfers():
    before = dict(COUNTERS)
    x = torch.zeros(16, dtype=torch.float32).to("spmd")
    (x + 1).cpu()
    delta = _delta(before)
    assert delta["bytes_to_device"] == 64 * torchspmd.device_count()  # replicated
    assert delta["bytes_to_host"] == 64


def test_metrics_report_lists_counters(capsys):
    from torchspmd.debug import metrics_report

    metrics_report()
    assert "graphs_compiled" in capsys.readouterr().out


def test_wait_device_ops_blocks():
    x = torch.randn(64, 64, device="spmd")
    y = x @ x
    torchspmd.sync(wait=False)
    torchspmd.wait_device_ops()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)
