"""The main job across starter builds and training seeds: does the default run move every time?

For each build seed B (the starter recipe started from B: ``--base-model starter@B``;
the quality gate may move on to B + 1 ...) and each training seed S, one run of
``posttrain grpo`` (or ``posttrain dpo``, ``posttrain sft``) with nothing but
``--seed S`` changed from the defaults. The data seed stays 0, so every run of one
build shares its holdout and its base evaluation, and the runs compare pair by pair.
The table gives each run's verdict, paired delta with its interval, the noise band it
had to clear, its guard and the categories that went down, the alarms it raised and
its wall time.

    .venv/bin/python benchmarks/seed_study.py --recipe grpo --builds 0,1,2 --seeds 0-4
    .venv/bin/python benchmarks/seed_study.py --recipe dpo --builds 0,1,2 --seeds 0-2 --write
    .venv/bin/python benchmarks/seed_study.py --recipe sft --env examples/library_env.py:ENV
    .venv/bin/python benchmarks/seed_study.py --env refund-multiturn --builds 0,1 --seeds 0-2

Runs go to a scratch folder; the builds to the models folder ($POSTTRAIN_MODELS).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from results_md import cpu_description, write_section
from starter_builds import seeds_from

from posttrain.cpu_numerics import choose_numerics, set_up_cpu


def run_one(recipe: str, build: int, seed: int, runs_dir: str, env: str = "refund",
            starter: str | None = None) -> dict[str, Any]:
    """One default run of ``recipe`` on the environment's starter (or ``starter``) from
    build seed ``build`` (``starter@build`` for refund) with training seed ``seed``."""
    from posttrain.envs import get_env
    from posttrain.policy.starters.build import build_starter

    starter = starter or getattr(get_env(env), "starter_model", None) or "starter"
    name = f"{starter}@{build}"
    # an environment without a starter of its own gets one built from its hooks
    folder = build_starter(name, show_progress=False, env=env)
    build_record = json.loads((folder / "build.json").read_text())
    starter = build_record.get("name", starter)
    if recipe == "grpo":
        from posttrain.train.grpo.run import run_grpo as run
        from posttrain.train.grpo.settings import GRPOSettings as Settings
    elif recipe == "sft":
        from posttrain.train.sft.run import run_sft as run
        from posttrain.train.sft.settings import SFTSettings as Settings
    else:
        from posttrain.train.dpo.run import run_dpo as run
        from posttrain.train.dpo.settings import DPOSettings as Settings
    settings = Settings(run_name=f"{recipe}-b{build}-s{seed}", runs_dir=runs_dir,
                        base_model=name, seed=seed, env=env)
    quiet = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        summary = run(settings, say=lambda line: None)
    delta = summary.get("delta") or {}
    return {
        "starter": starter, "build": build, "build_seed": build_record.get("build_seed"),
        "seed": seed,
        "before": summary.get("before", {}).get("pass_at_1"),
        "after": summary.get("after", {}).get("pass_at_1"),
        "delta": delta.get("delta"), "ci95": delta.get("ci95"),
        "band": delta.get("noise_band_used"), "verdict": summary.get("verdict"),
        "alarms": [f"{a['kind']} {a['step']}" for a in summary.get("alarms", [])],
        # the guards (well_formed) and the categories that went down: a verdict of
        # `moved` that broke what the guard measures is not a good run
        "guards": [f"{g['name']} {g['before']:.2f}->{g['after']:.2f} "
                   f"{'FELL' if g['fell'] else 'held'}" for g in delta.get("guards") or []],
        "down": list(delta.get("groups_down") or []),
        "seconds": time.monotonic() - started,
        "build_seconds": build_record.get("seconds"), "probe": build_record.get("probe"),
        "gate": build_record.get("gate"),
    }


def markdown(recipe: str, rows: list[dict[str, Any]], command: str, env: str = "refund",
             starter: str | None = None) -> tuple[str, str]:
    title = f"Seed study: `posttrain {recipe}` defaults across builds and training seeds"
    if env != "refund":
        title = (f"Seed study: `posttrain {recipe} --env {env}` defaults across builds and "
                 "training seeds")
    if starter:
        title += f" ({starter})"
    lines = [
        f"## {title}",
        "",
        f"Command: `{command}`. Machine: {cpu_description()}, no "
        "GPU. Every run: the recipe's defaults, `--base-model STARTER@B --seed S`; data "
        "seed 0, so the runs of one build share their holdout and base evaluation.",
        "",
        "| build (seed kept) | training seed | pass@1 before -> after | delta [95%] | "
        "noise band | verdict | guard | down | alarms | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ci = row["ci95"] or (None, None)
        interval = "–" if ci[0] is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"
        band = "–" if row["band"] is None else f"±{row['band']:.2f}"
        lines.append(
            f"| {row['starter']}@{row['build']} ({row['build_seed']}) | {row['seed']} | "
            f"{row['before']:.2f} -> {row['after']:.2f} | {row['delta']:+.2f} {interval} | "
            f"{band} | {row['verdict']} | {'; '.join(row['guards']) or '–'} | "
            f"{', '.join(row['down']) or 'none'} | {', '.join(row['alarms']) or 'none'} | "
            f"{row['seconds']:.0f} |")
    moved = sum(row["verdict"] == "moved" for row in rows)
    alarms = sum(len(row["alarms"]) for row in rows)
    fell = sum(any("FELL" in guard for guard in row["guards"]) for row in rows)
    down = sum(bool(row["down"]) for row in rows)
    bands = [row["band"] for row in rows if row["band"] is not None]
    lines += ["", f"{moved} of {len(rows)} runs read `moved`; {alarms} alarms in all; a guard "
              f"fell in {fell}, a category went down in {down}; noise band "
              f"{min(bands):.2f}-{max(bands):.2f}." if bands else ""]
    builds = {row["build"]: row for row in rows if row.get("build_seconds") is not None}
    if builds:
        lines += ["", "| build | gate | probe | build s |", "|---|---|---|---|"]
        for build, row in sorted(builds.items()):
            probe = row["probe"] or {}
            rates = ", ".join(f"{k} {v:.2f}" for k, v in probe.get("pass_rate", {}).items())
            copy = probe.get("copy_rate")
            copied = f"copy {copy:.2f}; " if copy is not None else ""
            lines.append(f"| {row['starter']}@{build} ({row['build_seed']}) | {row['gate']} | "
                         f"{copied}{rates} | {row['build_seconds']:.0f} |")
    return "\n".join(lines) + "\n", title


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=("grpo", "dpo", "sft"), default="grpo")
    parser.add_argument("--builds", default="0,1,2", help="starter build seeds")
    parser.add_argument("--seeds", default="0-4", help="training seeds: 0-4 or 0,2")
    parser.add_argument("--env", default="refund",
                        help="environment (its starter_model is the base, e.g. "
                        "refund-multiturn -> starter-multiturn)")
    parser.add_argument("--starter", default=None,
                        help="the starter to build from each seed (default: the "
                        "environment's, e.g. starter for refund; starter-2m is the 1.6M one)")
    parser.add_argument("--numerics", choices=("auto", "pinned", "native"), default="auto",
                        help="the kernels, as every command's --numerics: auto pins them for "
                        "the embedded starters (the README's numbers); native was what the "
                        "study ran on before 2026-12-07")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    # as a command does, before torch loads: the runs then compute what the README's do
    mode, reason = choose_numerics(args.numerics, embedded_model=True)
    print(f"numerics: {set_up_cpu(mode, reason).to_dict()}", file=sys.stderr, flush=True)
    rows = []
    command = (f"python benchmarks/seed_study.py --recipe {args.recipe} --builds {args.builds} "
               f"--seeds {args.seeds}" + (f" --env {args.env}" if args.env != "refund" else "")
               + (f" --starter {args.starter}" if args.starter else "")
               + (f" --numerics {args.numerics}" if args.numerics != "auto" else ""))
    with tempfile.TemporaryDirectory(prefix="posttrain-seed-study-") as runs_dir:
        for build in seeds_from(args.builds):
            for seed in seeds_from(args.seeds):
                row = run_one(args.recipe, build, seed, runs_dir, args.env, args.starter)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                section, title = markdown(args.recipe, rows, command, args.env, args.starter)
                if args.write:  # a row at a time: a long study keeps what it measured
                    write_section(title, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
