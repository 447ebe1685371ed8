"""The recipes' own path on real weights: a GRPO step and an SFT step on SmolLM2-135M
through posttrain's commands (TRL's trainers), with the old settings and with the
defaults, phase by phase, with peak memory.

Each configuration is one ``posttrain grpo`` / ``posttrain sft`` run on ``smollm2`` with
the README's shapes (GRPO: 4 prompts x 4 completions a step; SFT: 8 demonstrations a
step), ``--steps`` steps, a small evaluation around it. Read from each run's metrics: the
median seconds of a step (GRPO: TRL's ``step_time`` plus the optimizer step; SFT, which
logs no step time: the gap between consecutive steps' log times), the median of each
phase (``posttrain/train/grpo/step_phases.py``: generation, scoring, rewards, loss forward,
backward, optimizer) and the run's peak resident memory (the whole process: loading and
the evaluations around training included). The baseline
is the path before issue #30's work: the settings before the real-weights defaults
(``--precision fp32 --micro-batch 16 --rollout trl --shared-prefix off``; SFT
``--precision fp32 --micro-batch 8``: one pass) and TRL's fused LM
head scoring every position on a CPU (``posttrain/train/fused_head.py`` has no switch, so
the baseline's run swaps it for a no-op before calling the CLI); "defaults" is the command
as a user runs it, every flag at its default (``auto``); for GRPO, "no shared prefix" is
the defaults with ``--shared-prefix off`` (passes of 4), to show what running the
prompts' shared head once per pass adds.

    .venv/bin/python benchmarks/real_path.py              # about 20 minutes on 2 cores
    .venv/bin/python benchmarks/real_path.py --write      # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results_md import cpu_description, write_section  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parents[1]
GRPO = ["grpo", "--base-model", "smollm2", "--prompts", "40", "--num-generations", "4",
        "--batch-size", "16", "--eval-samples", "1", "--eval-repeats", "1",
        "--monitor-every", "0"]
SFT = ["sft", "--base-model", "smollm2", "--prompts", "40", "--batch-size", "8",
       "--eval-samples", "1", "--eval-repeats", "1"]
CONFIGS = {
    "grpo": {"baseline": ["--precision", "fp32", "--micro-batch", "16", "--rollout", "trl",
                          "--shared-prefix", "off"],
             "no shared prefix": ["--shared-prefix", "off"],
             "defaults": []},
    "sft": {"baseline": ["--precision", "fp32", "--micro-batch", "8"], "defaults": []},
}
# the baseline's CLI with TRL's own CPU behaviour for the fused LM head (every position)
EVERY_POSITION = ("import contextlib, sys; import posttrain.train.trl_run as trl_run; "
                  "trl_run.labelled_positions_only = contextlib.nullcontext; "
                  "from posttrain.cli import main; sys.exit(main())")
PEAK_OF_CHILD = ("import resource, subprocess, sys; "
                 "code = subprocess.run(sys.argv[1:]).returncode; "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
                 "file=sys.stderr); sys.exit(code)")
PHASES = ("generation_time", "scoring_time", "reward_time", "loss_forward_time",
          "backward_time", "optimizer_time")


def run(recipe: str, config: str, steps: int, runs: Path) -> dict:
    name = f"{recipe}-{config.replace(' ', '-')}"
    base = GRPO if recipe == "grpo" else SFT
    entry = ["-c", EVERY_POSITION] if config == "baseline" else ["-m", "posttrain"]
    command = [sys.executable, *entry, *base, *CONFIGS[recipe][config],
               "--steps", str(steps), "--run-name", name, "--runs-dir", str(runs),
               "--overwrite"]
    print("$ posttrain " + " ".join(command[3:]), flush=True)
    # a wrapper whose one child is the run: its children's peak is the run's own
    done = subprocess.run([sys.executable, "-c", PEAK_OF_CHILD, *command], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    peak_kib = int(done.stderr.strip().splitlines()[-1])
    said = [line for line in done.stdout.splitlines()
            if line.startswith(("rollouts:", "trainer in", "step time:"))]
    metrics = [json.loads(line)["metrics"] for line in (runs / name / "metrics.jsonl").open()]
    trained = [m for m in metrics if "train_runtime" not in m and "loss" in m]
    row = {"config": config, "said": said, "peak_gib": peak_kib / 2**20}
    if recipe == "grpo":
        timed = [m for m in trained if "step_time" in m]
        row["step_s"] = statistics.median(m["step_time"] + m["optimizer_time"] for m in timed)
        for phase in PHASES:
            row[phase] = statistics.median(m[phase] for m in timed)
    else:  # SFT logs no step time: the gaps between its steps' log times
        stamps = [entry["time"] for entry in map(json.loads, (runs / name / "metrics.jsonl")
                                                  .open()) if "loss" in entry["metrics"]]
        row["step_s"] = statistics.median(b - a for a, b in itertools.pairwise(stamps))
    return row


def table(recipe: str, rows: list[dict]) -> str:
    base = rows[0]["step_s"]
    if recipe == "grpo":
        lines = ["| config | step (s) | x baseline | generation | scoring | loss fwd | backward "
                 "| optimizer | peak GiB |", "|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row['config']} | {row['step_s']:.1f} | {base / row['step_s']:.2f}"
                         f" | {row['generation_time']:.1f} | {row['scoring_time']:.1f} | "
                         f"{row['loss_forward_time']:.1f} | {row['backward_time']:.1f} | "
                         f"{row['optimizer_time']:.2f} | {row['peak_gib']:.1f} |")
    else:
        lines = ["| config | step (s) | x baseline | peak GiB |",
                 "|---|---|---|---|"]
        for row in rows:
            lines.append(f"| {row['config']} | {row['step_s']:.1f} | "
                         f"{base / row['step_s']:.2f} | {row['peak_gib']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per run (default 4)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    sections = []
    with tempfile.TemporaryDirectory(prefix="posttrain-real-path-") as folder:
        for recipe in ("grpo", "sft"):
            rows = [run(recipe, config, args.steps, Path(folder)) for config in CONFIGS[recipe]]
            text = table(recipe, rows)
            said = "\n".join(f"- {row['config']}: " + "; ".join(row["said"]) for row in rows)
            print(text + "\n" + said, flush=True)
            sections.append(f"**{recipe.upper()}**\n\n{text}\n\n{said}\n")
    if args.write:
        write_section("Real weights through the recipes", (
            "## Real weights through the recipes\n\n"
            f"Command: `.venv/bin/python benchmarks/real_path.py` ({args.steps} steps a run, "
            f"medians over a run's steps; {cpu_description()}). SmolLM2-135M-Instruct "
            "through `posttrain grpo` (4 prompts x 4 completions a step) and `posttrain sft` "
            "(8 demonstrations a step); baseline: `--precision fp32`, one pass (`--micro-batch "
            "16`/`8`), and for GRPO `--rollout trl --shared-prefix off`, with TRL's fused LM head "
            "scoring every position, the path before issue #30's work; defaults: every flag "
            "left at auto. Peak: the run process's resident "
            "peak (loading and the evaluations included).\n\n"
            + "\n".join(sections)))


if __name__ == "__main__":
    main()
