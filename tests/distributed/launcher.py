"""Launching test programs as several processes on free localhost ports, bounded in time.

A launch that runs past its timeout is killed (its whole process group) and the test
fails with the processes' output: a hang never outlives its test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "JAX_COORDINATOR_ADDRESS", "TORCHSPMD_CPU_DEVICES")


@dataclass
class Finished:
    returncode: int
    output: str  # stdout and stderr together


def free_port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free (torch.distributed's and JAX's)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two adjacent free ports on localhost")


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment without any launch variables, the repo on the path."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _run_bounded(commands: list[list[str]], env: dict[str, str], timeout: float) -> list[Finished]:
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for cmd in commands]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        texts = [p.communicate()[0] for p in procs]
        pytest.fail(f"launch still running after {timeout} s, killed:\n"
                    + "\n".join(f"--- process {i} ---\n{t[-4000:]}" for i, t in enumerate(texts)))
    return [Finished(p.returncode, out) for p, out in zip(procs, outputs)]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 240) -> Finished:
    """``torchrun --nproc-per-node nproc script args`` on a free port."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--master-addr=127.0.0.1", f"--master-port={free_port_pair()}",
               str(script), *args]
    (finished,) = _run_bounded([command], child_env(), timeout)
    return finished


def spawn(script: Path, *args: str, nproc: int = 2, timeout: float = 120,
          **env: str) -> list[Finished]:
    """``nproc`` processes of ``script coordinator_port rank args``, no launcher."""
    port = free_port_pair()
    commands = [[sys.executable, str(script), str(port), str(rank), *args] for rank in range(nproc)]
    return _run_bounded(commands, child_env(**env), timeout)


def run(command: list[str], timeout: float = 240, **env: str) -> Finished:
    """One process of ``command`` (a list, ``sys.executable`` first), killed past ``timeout``."""
    (finished,) = _run_bounded([command], child_env(**env), timeout)
    return finished
