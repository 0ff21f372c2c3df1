"""``python -m torchspmd.testing.fuzz --programs N --seed S [--out DIR]``: run the fuzzer."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from torchspmd.testing.fuzz.parallel import fuzz_in_processes
from torchspmd.testing.fuzz.report import FAILURES, fuzz, load_repro, minimize, repro_script, run_program


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
    if args.jobs > 1:
        counts = fuzz_in_processes(args.programs, args.seed, args.start, args.jobs, args.out,
                                   args.shrink)
    else:
        counts = fuzz(args.programs, args.seed, args.out, args.start, args.verbose, args.shrink)
    print(f"{args.programs} programs (seed {args.seed}, from {args.start}) in "
          f"{time.time() - began:.0f} s:")
    for kind, n in sorted(counts.items()):
        print(f"  {kind}: {n}")
    return 1 if any(counts[k] for k in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
