"""A large prompts file through the data step and a scripted evaluation.

    python benchmarks/big_prompts.py [--prompts 200000] [--repeats 3]

Writes a prompts file of N refund prompts (distinct scenario ids), then times
`posttrain eval --agent seeded --prompts-file FILE --samples 1` (load, stratified split,
grade, statistics) and, as the baseline measured in the same run, the same command on a
file a quarter the size: near-linear paths give a ratio near 4. Prints the median of
`--repeats` runs of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from posttrain.envs import get_env


def write_prompts(path: Path, count: int) -> None:
    records = get_env("refund").write_prompts(2000, seed=0)
    with path.open("w") as handle:
        for index in range(count):
            record = records[index % len(records)]
            handle.write(json.dumps({"prompt": record["prompt"], "scenario_id": f"s{index}",
                                     "category": record["category"]}) + "\n")


def timed_eval(path: Path) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "posttrain", "eval", "--agent", "seeded",
                    "--prompts-file", str(path), "--samples", "1"], check=True,
                   capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200_000, help="prompts in the big file")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        big, small = Path(folder) / "big.jsonl", Path(folder) / "small.jsonl"
        write_prompts(big, args.prompts)
        write_prompts(small, args.prompts // 4)
        small_times = [timed_eval(small) for _ in range(args.repeats)]
        big_times = [timed_eval(big) for _ in range(args.repeats)]
    small_median, big_median = statistics.median(small_times), statistics.median(big_times)
    print(f"{args.prompts // 4} prompts: median {small_median:.1f} s "
          f"({', '.join(f'{t:.1f}' for t in small_times)})")
    print(f"{args.prompts} prompts: median {big_median:.1f} s "
          f"({', '.join(f'{t:.1f}' for t in big_times)})")
    print(f"ratio {big_median / small_median:.2f} for 4x the prompts")


if __name__ == "__main__":
    main()
