"""``python -m torchspmd.testing.fuzz --programs N --seed S [--out DIR]``: run the fuzzer."""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from torchspmd.testing.fuzz.report import (FAILURES, fuzz, fuzz_in_worker, load_repro, minimize,
                                           repro_script, run_program)


def _fuzz_in_parallel(args) -> collections.Counter:
    """Programs split into ``--jobs`` contiguous ranges, each run by its own process."""
    share = -(-args.programs // args.jobs)
    end = args.start + args.programs
    ranges = [(i, min(share, end - i)) for i in range(args.start, end, share)]
    # "spawn": JAX's runtime threads do not survive a fork.
    with ProcessPoolExecutor(len(ranges), mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = [pool.submit(fuzz_in_worker, n, args.seed, args.out, start, args.verbose,
                             args.shrink) for start, n in ranges]
        return sum((part.result() for part in parts), collections.Counter())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first program")
    parser.add_argument("--out", default="fuzz-failures", help="where repro scripts go")
    parser.add_argument("--shrink", action="store_true",
                        help="minimize each failing program before writing its repro")
    parser.add_argument("--only", type=int, help="run (and shrink) just this program index")
    parser.add_argument("--shrink-file", help="minimize the program of this repro script "
                        "(written by an earlier run) and rewrite the script")
    parser.add_argument("--verbose", action="store_true", help="print every outcome")
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes running programs side by side (one per core)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # XLA's CPU threads and torch's fight on small hosts
    began = time.time()
    if args.shrink_file:
        program = load_repro(args.shrink_file)
        program, outcome = minimize(program, run_program(program))
        Path(args.shrink_file).write_text(repro_script(program, outcome))
        print(f"{outcome.kind}: {outcome.detail.strip().splitlines()[0] if outcome.detail else ''}")
        print(program.source)
        return 0
    if args.only is not None:
        args.start, args.programs = args.only, 1
    counts = _fuzz_in_parallel(args) if args.jobs > 1 else \
        fuzz(args.programs, args.seed, args.out, args.start, args.verbose, args.shrink)
    print(f"{args.programs} programs (seed {args.seed}, from {args.start}) in "
          f"{time.time() - began:.0f} s:")
    for kind, n in sorted(counts.items()):
        print(f"  {kind}: {n}")
    return 1 if any(counts[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
