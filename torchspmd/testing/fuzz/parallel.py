"""Running the fuzzer in several processes, each surviving the others' (and XLA's) aborts.

XLA reports some of its own bugs with a CHECK failure that kills the process, which no
Python code can catch. So each job runs its range of programs in a child process that
prints every outcome; when a child dies, the program after the last one it reported is
counted as a ``process abort`` (a failure: a user's process would die too), its repro is
written, and a new child goes on with the next program. Example::

    >>> counts = fuzz_in_processes(programs=100, seed=0, start=0, jobs=2, out_dir="fuzz-failures")
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torchspmd.testing.fuzz.generator import generate
from torchspmd.testing.fuzz.report import FAILURES, child_environment, repro_script
from torchspmd.testing.fuzz.runner import ABORT, INTERNAL, INVALID, OK, USER, WRONG, Outcome

KINDS = (OK, USER, WRONG, INTERNAL, INVALID)

# One outcome line of ``--verbose``: "[index] kind (subkind): detail".
_OUTCOME = re.compile(r"^\[(\d+)\] ([a-z ]+?)(?: \(([^)]*)\))?: ")


def _run_range(start: int, end: int, seed: int, out_dir: str | None,
               shrink: bool) -> collections.Counter:
    """Programs ``start .. end-1``, in as many child processes as aborts make necessary."""
    counts: collections.Counter = collections.Counter()
    first = start
    while start < end:
        command = [sys.executable, "-m", "torchspmd.testing.fuzz", "--programs", str(end - start),
                   "--start", str(start), "--seed", str(seed), "--verbose", "--jobs", "1"]
        if out_dir is not None:
            command += ["--out", str(out_dir)]
        if shrink:
            command.append("--shrink")
        # One pipe for both streams, read as it comes: XLA writes warnings to stderr, and a
        # second pipe nobody drains would fill up and stop the child.
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=child_environment())
        last = start - 1
        others: collections.deque[str] = collections.deque(maxlen=40)  # for an abort's detail
        for line in child.stdout:
            match = _OUTCOME.match(line)
            if match:
                last = int(match.group(1))
                counts[match.group(2)] += 1
                if match.group(3):
                    counts[f"{match.group(2)}: {match.group(3)}"] += 1
                if match.group(2) in FAILURES or (last + 1) % 100 == 0:  # failures, progress
                    print(line if match.group(2) in FAILURES else
                          f"[{last}] {sum(counts[k] for k in KINDS)} programs of "
                          f"{first}..{end - 1} run: {dict(sorted(counts.items()))}\n",
                          end="", flush=True)
            elif line.startswith("    repro: "):
                print(line, end="", flush=True)
            else:
                others.append(line)
        stderr = "".join(others)
        if child.wait() == 0 or last + 1 >= end:
            break
        aborted = last + 1
        counts[ABORT] += 1
        detail = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        print(f"[{aborted}] {ABORT}: exit {child.returncode}: {detail}", flush=True)
        if out_dir is not None:
            _write_repro(Path(out_dir) / f"seed{seed}_{aborted}.py", seed, aborted, stderr[-2000:])
        start = aborted + 1
    return counts


def _write_repro(path: Path, seed: int, index: int, detail: str) -> None:
    """The aborted program's repro script; if even generating it fails (the generator's
    own bug), a note saying so, and the run goes on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.write_text(repro_script(generate(seed, index), Outcome(ABORT, detail)))
    except Exception as e:  # noqa: BLE001  (reported, never fatal to the other jobs)
        path = path.with_suffix(".txt")
        path.write_text(f"seed {seed}, program {index}: the generator raised {e!r}\n\n{detail}")
    print(f"    repro: {path}", flush=True)


def fuzz_in_processes(programs: int, seed: int, start: int, jobs: int, out_dir: str | None = None,
                      shrink: bool = False) -> collections.Counter:
    """Programs ``start .. start+programs-1`` of ``seed`` split into ``jobs`` contiguous
    ranges, each run by :func:`_run_range`; the outcomes counted together."""
    share = -(-programs // jobs)
    end = start + programs
    ranges = [(i, min(i + share, end)) for i in range(start, end, share)]
    with ThreadPoolExecutor(len(ranges)) as pool:
        parts = [pool.submit(_run_range, a, b, seed, out_dir, shrink) for a, b in ranges]
        return sum((part.result() for part in parts), collections.Counter())
