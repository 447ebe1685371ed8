"""The table `benchmarks/gpu.sh` prints: GRPO runs side by side, read from their folders.

    python benchmarks/gpu_summary.py RUNS_DIR RUN [RUN ...]

Per run: the median seconds per training step (TRL's ``step_time``), the share of it spent
generating completions (``generation_time``, logged by posttrain), the generated tokens per
second while generating (completion length x completions per step / generation time,
median over steps), the seconds of the before and after evaluations, and the verdict.
Works on any GRPO run folder, CPU runs too.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def run_facts(folder: Path) -> dict:
    """The numbers of one run folder (raises ``SystemExit`` naming what is missing)."""
    for name in ("summary.json", "config.json", "metrics.jsonl"):
        if not (folder / name).is_file():
            raise SystemExit(f"{folder / name}: missing; is {folder} a finished GRPO run?")
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    settings = config.get("settings", {})
    per_step = settings.get("batch_size") or 4 * settings.get("num_generations", 8)
    steps = [json.loads(line)["metrics"] for line in (folder / "metrics.jsonl").open()]
    timed = [m for m in steps if isinstance(m.get("step_time"), (int, float))]
    generating = [m for m in timed if isinstance(m.get("generation_time"), (int, float))]
    rates = [m["completion_length"] * per_step / m["generation_time"] for m in generating
             if m.get("completion_length") and m["generation_time"] > 0]
    timings = summary.get("timings", {})
    delta = summary.get("delta") or {}
    return {
        "run": folder.name,
        "steps": len(timed),
        "step_s": statistics.median(m["step_time"] for m in timed) if timed else None,
        "generation_share": summary.get("generation_share"),
        "tokens_per_s": statistics.median(rates) if rates else None,
        "before_eval_s": timings.get("before_eval_s"),
        "after_eval_s": timings.get("after_eval_s"),
        "pass_at_1": (summary.get("before", {}).get("pass_at_1"),
                      summary.get("after", {}).get("pass_at_1")),
        "delta": delta.get("delta"),
        "verdict": summary.get("verdict"),
        "status": summary.get("status"),
    }


def number(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(facts: list[dict]) -> str:
    header = ("| run | steps | s/step | generation share | tokens/s generating | "
              "eval before / after s | pass@1 before -> after | delta | verdict |")
    lines = [header, "|" + "---|" * 9]
    for f in facts:
        before, after = f["pass_at_1"]
        lines.append(
            f"| {f['run']} | {f['steps']} | {number(f['step_s'], '.2f')} | "
            f"{number(f['generation_share'], '.0%')} | {number(f['tokens_per_s'], '.0f')} | "
            f"{number(f['before_eval_s'], '.0f')} / {number(f['after_eval_s'], '.0f')} | "
            f"{number(before, '.2f')} -> {number(after, '.2f')} | {number(f['delta'], '+.2f')} | "
            f"{f['verdict'] or f['status']} |")
    if len(facts) > 1 and facts[0]["step_s"] and facts[-1]["step_s"]:
        lines.append(f"\nstep time {facts[0]['run']} / {facts[-1]['run']}: "
                     f"{facts[0]['step_s'] / facts[-1]['step_s']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = Path(argv[0])
    print(table([run_facts(runs / name) for name in argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
