"""Starter builds across build seeds and CPU kernels: how often the recipe meets its spec.

Each build trains the shipped recipe once from one build seed (no retry: the quality
gate's ``build_attempts`` set to 1), on torch's default kernels and, in a child
process, on the AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``: another CPU's float
rounding, on this machine), and records the gate's probe: teacher-forced copy rate,
pass rate and tool-call rate per category on the fixed probe set. The spec is the one
the gate applies (``posttrain.policy.starters.gate.StarterSpec``); the table says how
many builds met it, which is the chance a first build passes on a user's machine.

    .venv/bin/python benchmarks/starter_builds.py --name starter --seeds 0-5
    .venv/bin/python benchmarks/starter_builds.py --name starter-2m --seeds 0-5 --write

Builds go to a scratch models folder, never the user's cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

from results_md import cpu_description, write_section  # benchmarks/ is the script's folder

SECTION = "Starter builds across seeds and kernels"
KERNELS = ("default", "avx2")


def seeds_from(text: str) -> list[int]:
    """``0-5`` or ``0,2,4`` -> a list of build seeds."""
    if "-" in text:
        low, high = text.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(part) for part in text.split(",")]


def build_one(name: str, seed: int, models: str) -> dict:
    """Build ``name`` from ``seed`` once (in this process) and return its build record."""
    os.environ["POSTTRAIN_MODELS"] = models
    from posttrain.policy.starters.build import build_starter
    from posttrain.policy.starters.registry import recipe_for

    recipe = replace(recipe_for(name), seed=seed, build_attempts=1)
    folder = build_starter(recipe=recipe, show_progress=False)
    build = json.loads((folder / "build.json").read_text())
    attempt = build["attempts"][0]
    return {"seed": seed, "probe": attempt["probe"], "failures": attempt["failures"],
            "seconds": attempt["seconds"]}


def build_in_child(name: str, seed: int, models: str, kernel: str) -> dict:
    """``build_one`` in a fresh process, with torch's kernels chosen by ``kernel``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if kernel != "default":
        env["ATEN_CPU_CAPABILITY"] = kernel
    command = [sys.executable, __file__, "--child", name, str(seed), models]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(name: str, results: dict[str, list[dict]], spec_line: str) -> str:
    lines = [
        f"### `{name}`",
        "",
        f"Command: `python benchmarks/starter_builds.py --name {name} --seeds "
        f"{min(r['seed'] for rs in results.values() for r in rs)}-"
        f"{max(r['seed'] for rs in results.values() for r in rs)}`. Machine: "
        f"{cpu_description()}; one build per seed and kernel, no "
        f"retry. Spec: {spec_line}.",
        "",
        "| kernel | build seed | copy | with_id | no_id | off_topic | with_id tool calls | "
        "meets the spec | build s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kernel, rows in results.items():
        for row in rows:
            probe = row["probe"]
            rates = probe["pass_rate"]
            verdict = "yes" if not row["failures"] else "no: " + "; ".join(row["failures"])
            lines.append(
                f"| {kernel} | {row['seed']} | {probe['copy_rate']:.2f} | "
                f"{rates['with_id']:.2f} | {rates['no_id']:.2f} | {rates['off_topic']:.2f} | "
                f"{probe['tool_call_rate']['with_id']:.2f} | {verdict} | {row['seconds']:.0f} |")
    total = sum(len(rows) for rows in results.values())
    passed = sum(not row["failures"] for rows in results.values() for row in rows)
    lines += ["", f"{passed} of {total} builds meet the spec on the first build seed."]
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, seed, models = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        print(json.dumps(build_one(name, seed, models)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="starter", help="starter or starter-2m")
    parser.add_argument("--seeds", default="0-5", help="build seeds: 0-5 or 0,2,4")
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help="default and/or avx2 (comma-separated)")
    parser.add_argument("--write", action="store_true",
                        help="update this model's part of benchmarks/RESULTS.md")
    args = parser.parse_args()
    from posttrain.policy.starters.registry import recipe_for

    spec = recipe_for(args.name).spec
    spec_line = f"copy rate >= {spec.min_copy_rate:.2f}; " + ", ".join(
        f"{r.category} {r.low:.2f}-{r.high:.2f}" for r in spec.pass_rates)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-starter-builds-") as scratch:
        for kernel in args.kernels.split(","):
            results[kernel] = []
            for seed in seeds_from(args.seeds):
                models = os.path.join(scratch, kernel)
                row = build_in_child(args.name, seed, models, kernel)
                results[kernel].append(row)
                print(f"{args.name} {kernel} seed {seed}: {row['probe']['pass_rate']} copy "
                      f"{row['probe']['copy_rate']:.2f} -> {row['failures'] or 'meets the spec'}",
                      file=sys.stderr, flush=True)
    part = markdown(args.name, results, spec_line)
    print(part)
    if args.write:
        write_part(args.name, part)
    return 0


def write_part(name: str, part: str) -> None:
    """Keep the other model's table when rewriting this section."""
    from results_md import RESULTS

    text = RESULTS.read_text() if RESULTS.exists() else ""
    tables: dict[str, str] = {}
    if f"## {SECTION}\n" in text:
        body = text.split(f"## {SECTION}\n", 1)[1].split("\n## ", 1)[0]
        for chunk in body.split("### ")[1:]:
            tables[chunk.split("`")[1]] = "### " + chunk.rstrip("\n") + "\n"
    tables[name] = part
    intro = ("How often the shipped starter recipes meet their spec on a first build, on "
             "torch's default kernels and on the AVX2 ones (another CPU's rounding); "
             "`posttrain model build` retries from the next build seed when one does not "
             "(docs/policies.md).\n")
    section = f"## {SECTION}\n\n{intro}\n" + "\n".join(tables[key] for key in sorted(tables))
    write_section(SECTION, section)


if __name__ == "__main__":
    sys.exit(main())
