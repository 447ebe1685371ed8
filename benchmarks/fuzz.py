"""Fuzz every input target for longer than CI does, and report how many inputs each ran.

    .venv/bin/python benchmarks/fuzz.py                       # 20,000 inputs per target
    .venv/bin/python benchmarks/fuzz.py --examples 2000 --targets ingest_ops,pairs_file
    .venv/bin/python benchmarks/fuzz.py --seed 7              # a reproducible run

The targets and their contracts are in tests/fuzzing.py (the same ones tests/test_fuzz.py
runs briefly in CI). A broken contract stops the run with Hypothesis's shrunk input and
exit code 1. The printed table is what benchmarks/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzzing import TARGETS, run_target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20_000,
                        help="inputs per target (default: 20000)")
    parser.add_argument("--targets", default=",".join(sorted(TARGETS)),
                        help="comma-separated targets (default: all: "
                        f"{', '.join(sorted(TARGETS))})")
    parser.add_argument("--seed", type=int, default=None,
                        help="fixed Hypothesis seed (default: a fresh random run)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds per target at most (default: no limit)")
    args = parser.parse_args()
    names = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = [name for name in names if name not in TARGETS]
    if unknown or args.examples < 1:
        parser.error(f"unknown targets {unknown}" if unknown else "--examples must be >= 1")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}")
    print("| target | inputs | accepted | seconds | inputs/s |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        result = run_target(name, args.examples, seed=args.seed, time_budget=args.time_budget)
        print(f"| {name} | {result.examples:,} | {result.accepted:,} | {result.seconds:.1f} | "
              f"{result.examples / max(result.seconds, 1e-9):,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
