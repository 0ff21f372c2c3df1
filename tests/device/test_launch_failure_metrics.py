"""Metrics of a launch that fails: the run did not happen, so it is not counted."""

import pytest
import torch

import torchspmd
from torchspmd.runtime import program as program_module

DEVICE = torchspmd.device()


def test_a_launch_that_fails_counts_no_run(monkeypatch):
    def step():
        return (torch.ones(4).to(DEVICE) * 2).sum()

    step().cpu()  # compiled and run once
    value = step()
    before = {k: torchspmd.metrics()[k] for k in ("executions", "ops_executed", "ops_rerun")}
    real_call = program_module.Program._call

    def failing_call(self, *args):
        jitted, arguments, hoisted = real_call(self, *args)

        def fail(*_):
            raise RuntimeError("device lost")
        return fail, arguments, hoisted

    monkeypatch.setattr(program_module.Program, "_call", failing_call)
    with pytest.raises(RuntimeError, match="device lost"):
        value.cpu()
    after = {k: torchspmd.metrics()[k] for k in before}
    assert after == before
