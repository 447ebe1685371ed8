"""Logging overhead: what watching a GRPO run costs in wall time.

The same GRPO run of ``starter`` (the recipe's defaults: 40 steps, holdout evaluated
before twice and after once) is timed three ways, interleaved so that a change in the
machine's load hits all three alike:

- ``bare``: nothing recorded: the run store replaced by ``NullRun`` and no
  ``TrainerCallback``, ``--monitor-every 0``;
- ``store``: the run store (the SQLite file under the runs folder) fed by the
  ``TrainerCallback`` every step, ``--monitor-every 0``;
- ``store + monitor``: as ``store``, plus the ``HackMonitor`` every 10 steps
  (``--monitor-every 10``, the recipe's default): holdout sampling and ``hack_scan``.

The recipe has no switch for "record nothing", so the ``bare`` side swaps
``posttrain.runs.store.open_run`` for one returning ``NullRun()`` and
``posttrain.train.callbacks.TrainerCallback`` for a no-op callback while it runs (both
are looked up when a run starts). Wall time is the whole ``run_grpo`` call; the
training phase is the recipe's own ``timings["train_s"]``, where the callback and the
monitor act. TRL, PEFT and datasets are imported before the first timed run. Beside
the differences of wall times, the time spent inside the callback's and the monitor's
hooks is measured within each run, which the machine's load moves much less.

    .venv/bin/python benchmarks/logging_overhead.py            # 3 rounds
    .venv/bin/python benchmarks/logging_overhead.py --write    # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("POSTTRAIN_SERVER", None)  # the store side writes the local SQLite file

from results_md import write_section  # benchmarks/ is the script's folder
from transformers import TrainerCallback as HFTrainerCallback

from posttrain.runs.store import NullRun
from posttrain.train.grpo.run import run_grpo
from posttrain.train.grpo.settings import GRPOSettings

SECTION = "Logging overhead"
SIDES = ("bare", "store", "store + monitor")
TARGET = 0.05


class _NoCallback(HFTrainerCallback):
    """Stands in for ``TrainerCallback`` on the bare side: records nothing."""

    def __init__(self, run: Any, *, total_steps: int | None = None, **_: Any) -> None:
        self.run = run


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Run a recipe with the run store and its callback switched off."""
    import posttrain.runs.store as store_module
    import posttrain.train.callbacks as callbacks_module

    saved = store_module.open_run, callbacks_module.TrainerCallback
    store_module.open_run = lambda name, config, **_: NullRun()
    callbacks_module.TrainerCallback = _NoCallback
    try:
        yield
    finally:
        store_module.open_run, callbacks_module.TrainerCallback = saved


@contextlib.contextmanager
def timed_hooks(totals: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent inside the callback's and the monitor's hooks to ``totals``.

    Measured inside the run itself, this split does not depend on the machine's load the
    way a difference of two wall times does.
    """
    from posttrain.train.callbacks import TrainerCallback
    from posttrain.train.grpo.monitor import HackMonitor

    hooks = [(TrainerCallback, name, "callback")
             for name in ("on_train_begin", "on_step_end", "on_log")]
    hooks.append((HackMonitor, "on_step_end", "monitor"))
    saved = []
    for owner, name, key in hooks:
        original = owner.__dict__[name]
        saved.append((owner, name, original))

        def timed(self: Any, *args: Any, _original: Any = original, _key: str = key,
                  **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                totals[_key] += time.perf_counter() - started

        setattr(owner, name, timed)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def run_once(side: str, runs_dir: Path, name: str, steps: int,
             base_model: str = "starter") -> dict[str, float]:
    """One GRPO run; returns its wall and training-phase seconds, and the seconds spent
    in the callback's and the monitor's hooks."""
    settings = GRPOSettings(run_name=name, runs_dir=str(runs_dir), steps=steps,
                            base_model=base_model,
                            monitor_every=10 if side == "store + monitor" else 0)
    totals = {"callback": 0.0, "monitor": 0.0}
    recording = unrecorded() if side == "bare" else timed_hooks(totals)
    quiet = io.StringIO()
    with recording, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        started = time.perf_counter()
        summary = run_grpo(settings, say=lambda line: None)
        wall = time.perf_counter() - started
    return {"wall": wall, "train": float(summary["timings"]["train_s"]), **totals}


def warm_up() -> None:
    """Pay the one-time imports before the first timed run (a warm-up run would cost a
    whole holdout evaluation on a loaded 2-core machine)."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import trl  # noqa: F401


def markdown(times: dict[str, list[dict[str, float]]], command: str, load: str,
             rounds: int, steps: int, base_model: str) -> str:
    bare_wall = statistics.median(t["wall"] for t in times["bare"])
    bare_train = statistics.median(t["train"] for t in times["bare"])
    lines = [
        f"## {SECTION}",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, {os.cpu_count()} CPU cores "
        f"shared with other jobs (load average {load} at the start), no GPU; "
        f"Python {platform.python_version()}. A GRPO run of `{base_model}`, {steps} steps at the "
        f"recipe's defaults; median of {rounds} interleaved rounds. Target: watching costs "
        f"under {TARGET:.0%} of the run's wall time.",
        "",
        "| side | wall, median | vs bare | training phase, median | vs bare | wall per run |",
        "|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        wall = statistics.median(t["wall"] for t in times[side])
        train = statistics.median(t["train"] for t in times[side])
        lines.append(
            f"| {side} | {wall:.1f} s | {(wall - bare_wall) / bare_wall:+.1%} | {train:.1f} s | "
            f"{(train - bare_train) / bare_train:+.1%} | "
            f"{', '.join(format(t['wall'], '.1f') for t in times[side])} s |")
    full = times["store + monitor"]
    overhead = (statistics.median(t["wall"] for t in full) - bare_wall) / bare_wall
    callback = statistics.median(t["callback"] / t["wall"] for t in full)
    monitor = statistics.median(t["monitor"] / t["wall"] for t in full)
    store_only = statistics.median(t["callback"] / t["wall"] for t in times["store"])
    lines += [
        "",
        "Time spent inside the hooks, measured within each run (so the machine's load "
        "moves it much less than the wall-time differences above):",
        "",
        "| side | TrainerCallback + run store | HackMonitor (holdout sampling + hack_scan) |",
        "|---|---|---|",
        f"| store | {store_only:.2%} of wall | – |",
        f"| store + monitor | {callback:.2%} of wall | {monitor:.1%} of wall |",
        "",
        f"Store and monitor together: {overhead:+.1%} of the bare run's wall time by "
        f"difference, {callback + monitor:.1%} inside the hooks; the target is "
        f"{TARGET:.0%}. On a machine shared with other jobs the difference of wall times "
        "carries their noise (compare the walls per run); the time inside the hooks does "
        "not, and is the number to trust.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (median)")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per run")
    parser.add_argument("--base-model", default="starter",
                        help="model to train (starter-2m for a quick check of this script)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.write and args.base_model != "starter":
        parser.error("--write records the starter's numbers only")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    times: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    section = ""
    with tempfile.TemporaryDirectory(prefix="posttrain-overhead-bench-") as folder:
        runs_dir = Path(folder)
        warm_up()
        for round_index in range(args.rounds):
            for side in SIDES:
                name = f"{side.replace(' + ', '-')}-{round_index}"
                result = run_once(side, runs_dir, name, args.steps, args.base_model)
                times[side].append(result)
                print(f"round {round_index + 1}/{args.rounds} {side}: wall {result['wall']:.1f} s, "
                      f"train {result['train']:.1f} s, callback {result['callback']:.2f} s, "
                      f"monitor {result['monitor']:.1f} s", file=sys.stderr, flush=True)
            # a round at a time: on a slow machine the rounds done so far are kept
            done = round_index + 1
            command = "python benchmarks/logging_overhead.py" + (
                f" --rounds {done}" if done != 3 else "") + (
                f" --steps {args.steps}" if args.steps != 40 else "")
            section = markdown(times, command, load, done, args.steps, args.base_model)
            if args.write:
                write_section(SECTION, section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
