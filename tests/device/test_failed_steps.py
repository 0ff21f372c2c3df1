"""A step that fails to compile or launch fails alone (issue 20 §3).

The failure is injected into ``Program.run`` for every graph that computes a ``tanh``
(so it fails again if it is ever run again): once as a launch error, once as the
out-of-memory error the memory check raises. Everything else must stay usable, and the
tensors the failed step was to compute must say so when read, without the failing work
being run again by anything else.
"""

import pytest
import torch

import torchspmd as xs
from torchspmd.runtime import memory
from torchspmd.runtime import program as program_module

DEVICE = xs.device()


@pytest.fixture(params=["launch", "out_of_memory"])
def failing(request, monkeypatch) -> dict:
    """Make every program that computes a tanh fail; counts the failed runs."""
    real_run = program_module.Program.run
    seen = {"runs": 0, "kind": request.param}

    def run(self, graph, *args, **kwargs):
        if any(getattr(n.sig.op, "__name__", "").startswith("tanh") for n in graph.nodes):
            seen["runs"] += 1
            if request.param == "launch":
                raise RuntimeError("device lost (injected)")
            raise memory.out_of_memory(graph, "injected")
        return real_run(self, graph, *args, **kwargs)

    monkeypatch.setattr(program_module.Program, "run", run)
    return seen


def _message(failing: dict) -> str:
    return "device lost" if failing["kind"] == "launch" else "the step cannot be run: injected"


def test_an_independent_computation_of_the_failed_sync_is_computed(failing):
    cpu = torch.randn(4)
    x = cpu.to(DEVICE)
    xs.sync()
    independent, doomed = x * 5, torch.tanh(x)
    with pytest.raises(Exception, match=_message(failing)):
        xs.sync()
    torch.testing.assert_close(independent.cpu(), cpu * 5, rtol=0, atol=0)
    del doomed


def test_failed_values_raise_an_error_naming_the_failure_and_it_is_not_run_again(failing):
    cpu = torch.randn(4)
    x = cpu.to(DEVICE) * 3
    xs.sync()
    doomed = torch.tanh(x)
    derived = doomed * 2  # computed from a value that will never exist
    with pytest.raises(Exception, match=_message(failing)):
        xs.sync()
    # What was computed before, and new work, are untouched by the failure.
    torch.testing.assert_close(x.cpu(), cpu * 3, rtol=0, atol=0)
    torch.testing.assert_close((x + 1).cpu(), cpu * 3 + 1, rtol=0, atol=0)
    for _ in range(2):
        with pytest.raises(Exception, match=_message(failing)) as info:
            doomed.cpu()
        if failing["kind"] == "launch":
            assert "the step that was to compute it failed" in str(info.value)
        else:
            assert isinstance(info.value, torch.OutOfMemoryError)
        with pytest.raises(Exception, match=_message(failing)):
            derived.cpu()
    assert failing["runs"] == 1


def test_reading_another_value_while_failing_work_is_pending_gives_that_value(failing):
    cpu = torch.randn(4)
    x = cpu.to(DEVICE)
    xs.sync()
    doomed = torch.tanh(x)
    read = x + 1
    torch.testing.assert_close(read.cpu(), cpu + 1, rtol=0, atol=0)  # the failure is not its
    runs = failing["runs"]  # the failed graph, then its failing part alone
    torch.testing.assert_close((x * 7).sum().cpu(), (cpu * 7).sum())
    xs.sync()  # the failed work was dropped, not left pending to fail every later sync
    assert failing["runs"] == runs
    with pytest.raises(Exception, match=_message(failing)):
        doomed.cpu()
