"""Failures that used to take the process down or hang it (issue 9 §4).

An exception inside ``backward()`` (a backward op with no lowering, a hook that raises)
aborted the process; a step whose output could not be allocated made reading its other
values hang. Both run in one child process (with its address space limited, so a
regression fails the test instead of eating the machine's memory), which reports what
happened; each test below checks one behaviour of that report.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, torch
    import torchspmd
    dev = torchspmd.device()
    report = {}

    def outcome(fn):
        try:
            fn()
            return {"raised": None}
        except BaseException as error:
            return {"raised": type(error).__name__, "message": str(error)}

    x = torch.randn(4, device=dev, requires_grad=True)

    class Unlowered(torch.autograd.Function):  # its backward calls an op with no lowering
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return torch.quantize_per_tensor(grad, 0.1, 0, torch.quint8)

    report["no_lowering"] = outcome(lambda: Unlowered.apply(x).sum().backward())

    def hook(grad):
        raise ValueError("raised in a backward hook")
    y = torch.randn(4, device=dev, requires_grad=True) * 2
    y.register_hook(hook)
    report["hook"] = outcome(lambda: y.sum().backward())

    w = torch.randn(4, requires_grad=True)
    v = w.detach().to(dev).requires_grad_()
    (v * v).sum().backward()
    report["backward_after"] = torch.allclose(v.grad.cpu(), 2 * w.detach())

    small = torch.ones(4, device=dev) * 2
    big = torch.ones(2**33, device=dev)
    report["sync"] = outcome(torchspmd.sync)
    report["read_big"] = outcome(lambda: big[:2].cpu())
    report["read_small"] = outcome(lambda: small.cpu())
    report["small"] = small.cpu().tolist()
    report["later"] = (torch.arange(3, device=dev) + 1).cpu().tolist()
    print("REPORT" + json.dumps(report))
''')

ADDRESS_SPACE = 16 << 30  # far below what the big step needs, above what the rest needs


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TORCHSPMD_COMPILATION_CACHE", str(ROOT / ".cache" / "jax"))
    env["TORCHSPMD_CPU_DEVICES"] = "2"  # enough for a multi-device step; starts faster
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=240, env=env, preexec_fn=_limit_memory)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT")]
    assert done.returncode == 0 and lines, (
        f"the child process died (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len("REPORT"):])


def test_backward_op_without_lowering_raises_its_error(report):
    assert report["no_lowering"]["raised"] == "NotImplementedError"
    assert "quantize_per_tensor" in report["no_lowering"]["message"]


def test_exception_in_a_backward_hook_reaches_the_caller(report):
    assert report["hook"] == {"raised": "ValueError", "message": "raised in a backward hook"}


def test_backward_works_after_failed_backwards(report):
    assert report["backward_after"] is True


def test_step_that_cannot_be_allocated_raises_out_of_memory_saying_to_shard(report):
    assert report["sync"]["raised"] == "OutOfMemoryError"
    message = report["sync"]["message"]
    assert "shape (8589934592,)" in message and "mark_sharding" in message


def test_the_value_that_could_not_be_allocated_raises_the_same_error_when_read(report):
    assert report["read_big"]["raised"] == "OutOfMemoryError"
    assert report["read_big"]["message"] == report["sync"]["message"]


def test_an_independent_value_of_the_same_sync_is_computed(report):
    assert report["read_small"] == {"raised": None}
    assert report["small"] == [2.0, 2.0, 2.0, 2.0]


def test_later_work_runs(report):
    assert report["later"] == [1, 2, 3]
