"""Running many fuzz programs: outcomes counted, failures written as repro scripts.

Example::

    >>> counts = fuzz(programs=100, seed=0, out_dir="fuzz-failures")
    >>> sorted(counts)          # e.g. ['ok', 'user error', 'user error: mesh mismatch']
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

from torchspmd.testing.fuzz.generator import Program, generate
from torchspmd.testing.fuzz.runner import ABORT, INTERNAL, INVALID, WRONG, Outcome, run_source

FAILURES = (WRONG, INTERNAL, INVALID, ABORT)


def run_program(program: Program) -> Outcome:
    """Run one generated program on CPU and on the device, and compare."""
    return run_source(program.source, program.mixes_device_sets)


def repro_script(program: Program, outcome: Outcome) -> str:
    """A standalone script that replays ``program`` and prints its outcome."""
    summary = outcome.detail.strip().splitlines()[0] if outcome.detail else ""
    return (f'"""Fuzz repro: seed {program.seed}, program {program.index}: {outcome.kind}.\n\n'
            f"{summary}\n\"\"\"\n"
            "import torch\n\n"
            "from torchspmd.testing.fuzz.runner import data, replay\n\n\n"
            f"{program.source}\n\n"
            'if __name__ == "__main__":\n'
            f"    replay(program, mixes_device_sets={program.mixes_device_sets})\n")


def _same_failure(a: Outcome, b: Outcome) -> bool:
    return a.kind == b.kind and a.subkind == b.subkind and \
        a.detail.split(":")[0] == b.detail.split(":")[0]


def _with_lines(program: Program, lines: list[str]) -> Program:
    defined = [line.split(" = ")[0].strip() for line in lines
               if re.match(r"\s*t\d+ = ", line)]
    names = list(dict.fromkeys(defined))
    result = ", ".join(f"{n!r}: {n}" for n in names)
    source = "def program(dev, xs):\n" + "".join(line + "\n" for line in lines) + \
        f"    return {{{result}}}\n"
    return Program(program.seed, program.index, source, program.mixes_device_sets)


def minimize(program: Program, outcome: Outcome) -> tuple[Program, Outcome]:
    """Drop the program's lines one at a time while it still fails the same way.

    Greedy, one pass from the end (later lines depend on earlier ones): enough to turn a
    20-line program into the few lines a bug report needs.
    """
    if outcome.kind not in FAILURES:
        return program, outcome
    lines = program.source.splitlines()[1:-1]  # the body, without def and return
    i = len(lines) - 1
    while i >= 0:
        trial = _with_lines(program, lines[:i] + lines[i + 1:])
        try:
            again = run_program(trial)
        except Exception:  # a malformed cut (a name used but no longer defined)
            again = Outcome("")
        if _same_failure(again, outcome):
            lines, program, outcome = lines[:i] + lines[i + 1:], trial, again
        i -= 1
    return program, outcome


def load_repro(path: str | Path) -> Program:
    """The program of a repro script written by :func:`repro_script`."""
    text = Path(path).read_text()
    source = text[text.index("def program("):text.index('if __name__ == "__main__":')].strip()
    seed, index = (int(n) for n in re.search(r"seed (\d+), program (\d+)", text).groups())
    mixes = "mixes_device_sets=True" in text
    return Program(seed, index, source + "\n", mixes)


def child_environment() -> dict[str, str]:
    """The environment of a child process that must import this torchspmd (a worktree's),
    not whichever one is installed."""
    root = str(Path(__file__).resolve().parents[3])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))


# For the parallel runner's own test: abort the process at this program index, as an XLA
# CHECK failure does.
ABORT_AT = "TORCHSPMD_FUZZ_TEST_ABORT_AT"


def _reproduces(path: Path) -> bool:
    """Whether the repro script fails on its own, in a fresh process."""
    done = subprocess.run([sys.executable, str(path)], capture_output=True, timeout=600,
                          env=child_environment())
    return done.returncode != 0


def fuzz(programs: int, seed: int, out_dir: str | Path | None = None, start: int = 0,
         verbose: bool = False, shrink: bool = False) -> collections.Counter:
    """Run programs ``start .. start+programs-1`` of ``seed``; count outcomes by kind.

    Each failure (wrong value, internal error, invalid program) is printed, and written to
    ``out_dir/seed<S>_<index>.py`` when ``out_dir`` is given, then re-run there in a fresh
    process to tell whether it reproduces on its own (``shrink``: minimized first).
    """
    counts: collections.Counter = collections.Counter()
    for index in range(start, start + programs):
        if os.environ.get(ABORT_AT) == str(index):
            os.abort()
        program = generate(seed, index)
        outcome = run_program(program)
        counts[outcome.kind] += 1
        if outcome.subkind:
            counts[f"{outcome.kind}: {outcome.subkind}"] += 1
        if verbose or outcome.kind in FAILURES:
            first = outcome.detail.strip().splitlines()[0] if outcome.detail else ""
            sub = f" ({outcome.subkind})" if outcome.subkind else ""
            print(f"[{index}] {outcome.kind}{sub}: {first[:300]}", flush=True)
        if (index - start + 1) % 50 == 0:  # progress, so that a stopped run still tells
            print(f"after {index - start + 1} programs: {dict(sorted(counts.items()))}", flush=True)
        if outcome.kind in FAILURES and out_dir is not None:
            if shrink:
                program, outcome = minimize(program, outcome)
            path = Path(out_dir) / f"seed{seed}_{index}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(repro_script(program, outcome))
            alone = _reproduces(path)
            counts["reproduces standalone" if alone else "needs earlier programs"] += 1
            print(f"    repro: {path} ({'fails' if alone else 'passes'} on its own)", flush=True)
    return counts
