"""How much narrower the main job's intervals get on the shipped refund holdout.

For each training seed S, two runs of ``posttrain grpo`` that differ only in their
holdout: the default (20% of the template scenarios, 75 at data seed 0) and
``--holdout-set refund-holdout`` (477 grammar-written scenarios, every template prompt
training). The table gives each run's before/after pass@1 with its interval, the paired
delta with its interval, the noise band, the widths, the per-category delta widths and
the wall time; the summary line gives the median width ratio (set / default) over seeds.

    .venv/bin/python benchmarks/holdout_width.py --seeds 0-2 --write

Runs go to a scratch folder; the starter comes from the models folder ($POSTTRAIN_MODELS).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from results_md import cpu_description, write_section
from starter_builds import seeds_from

HOLDOUTS = {"default": None, "refund-holdout": "refund-holdout"}


def width(interval: list[float] | None) -> float | None:
    return None if not interval else interval[1] - interval[0]


def run_one(holdout: str, seed: int, runs_dir: str) -> dict[str, Any]:
    from posttrain.train.grpo.run import run_grpo
    from posttrain.train.grpo.settings import GRPOSettings

    settings = GRPOSettings(run_name=f"{holdout}-s{seed}", runs_dir=runs_dir, seed=seed,
                            holdout_set=HOLDOUTS[holdout])
    quiet = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        summary = run_grpo(settings, say=lambda line: None)
    delta = summary.get("delta") or {}
    return {
        "holdout": holdout, "seed": seed,
        "scenarios": summary["before"]["n_scenarios"],
        "before": summary["before"]["pass_at_1"], "before_ci": summary["before"]["ci95"],
        "after": summary["after"]["pass_at_1"], "after_ci": summary["after"]["ci95"],
        "delta": delta.get("delta"), "delta_ci": delta.get("ci95"),
        "band": delta.get("noise_band_used"), "verdict": summary.get("verdict"),
        "category_widths": {group["name"]: width(group["ci95"])
                            for group in delta.get("groups", [])},
        "alarms": [f"{a['kind']} {a['step']}" for a in summary.get("alarms", [])],
        "eval_seconds": sum(value for key, value in summary.get("timings", {}).items()
                            if key.endswith("_eval_s")),
        "seconds": time.monotonic() - started,
    }


def markdown(rows: list[dict[str, Any]], command: str) -> tuple[str, str]:
    title = "Holdout width: the main job on the default holdout and on `refund-holdout`"
    lines = [
        f"## {title}",
        "",
        f"Command: `{command}`. Machine: {cpu_description()}, no GPU. Each training seed "
        "runs `posttrain grpo` twice, differing only in `--holdout-set`; starter build 0, "
        "data seed 0.",
        "",
        "| holdout | seed | scenarios | before [95%] | after [95%] | delta [95%] (width) | "
        "band | category delta widths | verdict | alarms | eval s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b, a, d = row["before_ci"], row["after_ci"], row["delta_ci"]
        categories = ", ".join(f"{name} {value:.2f}"
                               for name, value in row["category_widths"].items() if value)
        lines.append(
            f"| {row['holdout']} | {row['seed']} | {row['scenarios']} | "
            f"{row['before']:.2f} [{b[0]:.2f}, {b[1]:.2f}] | "
            f"{row['after']:.2f} [{a[0]:.2f}, {a[1]:.2f}] | "
            f"{row['delta']:+.2f} [{d[0]:+.2f}, {d[1]:+.2f}] ({width(d):.3f}) | "
            f"±{row['band']:.3f} | {categories} | {row['verdict']} | "
            f"{', '.join(row['alarms']) or 'none'} | {row['eval_seconds']:.0f} | "
            f"{row['seconds']:.0f} |")
    pairs = {}
    for row in rows:
        pairs.setdefault(row["seed"], {})[row["holdout"]] = row
    complete = [p for p in pairs.values() if len(p) == 2]
    if complete:
        ratio = statistics.median(width(p["refund-holdout"]["delta_ci"])
                                  / width(p["default"]["delta_ci"]) for p in complete)
        band = statistics.median(p["refund-holdout"]["band"] / p["default"]["band"]
                                 for p in complete)
        cost = statistics.median(p["refund-holdout"]["seconds"] / p["default"]["seconds"]
                                 for p in complete)
        lines += ["", f"Median over {len(complete)} seeds, refund-holdout / default: delta "
                  f"interval width x{ratio:.2f}, noise band x{band:.2f}, wall time x{cost:.2f}."]
    return "\n".join(lines) + "\n", title


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-2", help="training seeds: 0-2 or 0,4")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    command = f"python benchmarks/holdout_width.py --seeds {args.seeds}"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="posttrain-holdout-width-") as runs_dir:
        for seed in seeds_from(args.seeds):
            for holdout in HOLDOUTS:
                row = run_one(holdout, seed, runs_dir)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                section, title = markdown(rows, command)
                if args.write:
                    write_section(title, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
