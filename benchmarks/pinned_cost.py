"""What the pinned kernels cost on this CPU: a short GRPO run on the starter with
``--numerics pinned`` (ATen, MKL and oneDNN at AVX2, two threads: the same bits on every
CPU with AVX2) and ``--numerics native`` (the CPU's own kernels, every core), alternated
so the machine's drift falls on both, ``--runs`` of each.

Each run: ``posttrain grpo --steps 10 --eval-repeats 1 --monitor-every 0`` (every other
flag at its default) in a fresh process with none of the numerics variables inherited;
the phases' seconds come from the run's ``summary.json``. Both starters (pinned and
native builds) are built first when missing, outside the timing.

    .venv/bin/python benchmarks/pinned_cost.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLEARED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS",
           "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "POSTTRAIN_NUMERICS")
PHASES = ("before_eval_s", "train_s", "after_eval_s", "total_s")


def one_run(numerics: str, runs: Path, name: str, environ: dict[str, str]) -> dict[str, float]:
    subprocess.run([sys.executable, "-m", "posttrain", "grpo", "--numerics", numerics,
                    "--steps", "10", "--eval-repeats", "1", "--monitor-every", "0",
                    "--runs-dir", str(runs), "--run-name", name],
                   cwd=ROOT, env=environ, check=True, capture_output=True)
    timings = json.loads((runs / name / "summary.json").read_text())["timings"]
    return {phase: float(timings[phase]) for phase in PHASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each (median)")
    args = parser.parse_args()
    environ = {key: value for key, value in os.environ.items() if key not in CLEARED}
    environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    seconds: dict[str, list[dict[str, float]]] = {"pinned": [], "native": []}
    with tempfile.TemporaryDirectory(prefix="pinned-cost-") as scratch:
        runs = Path(scratch)
        for numerics in seconds:  # the starters built (or found) outside the timing
            subprocess.run([sys.executable, "-m", "posttrain", "model", "build", "--numerics",
                            numerics], cwd=ROOT, env=environ, check=True, capture_output=True)
        for run in range(args.runs):
            for numerics in seconds:
                taken = one_run(numerics, runs, f"{numerics}-{run}", environ)
                seconds[numerics].append(taken)
                print(f"run {run + 1} {numerics}: {taken}", flush=True)
    medians = {numerics: {phase: statistics.median(run[phase] for run in taken)
                          for phase in PHASES} for numerics, taken in seconds.items()}
    print(json.dumps({"runs": seconds, "median_s": medians,
                      "pinned_over_native": {phase: round(medians["pinned"][phase]
                                                          / medians["native"][phase], 3)
                                             for phase in PHASES}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
