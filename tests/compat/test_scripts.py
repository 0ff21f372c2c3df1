"""PyTorch/XLA SPMD scripts (tests/compat/scripts, written against torch_xla's API) run
unchanged through ``python -m torchspmd.compat`` and train."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.distributed.launcher import run

SCRIPTS = Path(__file__).parent / "scripts"


def _losses(script: str, steps: int) -> tuple[list[float], str]:
    finished = run([sys.executable, "-m", "torchspmd.compat", str(SCRIPTS / script),
                    "--steps", str(steps)])
    assert finished.returncode == 0, finished.output[-4000:]
    return [float(v) for v in re.findall(r"step \d+ loss ([\d.]+)", finished.output)], finished.output


@pytest.mark.parametrize("script", ["fsdpv2_scan.py", "dp_tp.py"])
def test_script_trains_unchanged(script):
    """Each step prints a loss; every loss is below the one before, and the loop compiled a
    bounded number of programs (no recompile per step)."""
    losses, output = _losses(script, steps=5)
    assert len(losses) == 5, output[-4000:]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    compiles = int(re.search(r"compiles (\d+)", output).group(1))
    assert compiles <= 3, output[-4000:]
