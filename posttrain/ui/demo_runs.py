"""Runs made up for looking at the dashboard, testing it in a browser and timing it.

Nothing here trains a model. The curves follow the shapes a GRPO run of ``starter``
draws (reward climbing from about 0.2, its spread narrowing, KL creeping up from zero),
with seeded noise. The summaries are not typed in: they come from the project's own
statistics (``pass_at``, ``delta`` with a noise band, ``category_table``) applied to
seeded graded rows, so the dashboard is tested against exactly the JSON a recipe writes.

- ``training_metrics(step, total, rng)``: one step's metrics, under the run-store names;
- ``monitor_metrics(step, total, rng)``: the HackMonitor's holdout numbers;
- ``grpo_summary(seed)`` / ``dpo_summary(seed)``: a finished run's summary;
- ``write_finished_run(store, name, ...)``: a whole finished run in a store;
- ``write_long_run(store, name, points)``: a run with ``points`` points per metric,
  written in one transaction (100,000 points of 6 metrics take a few seconds).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.score.delta import delta, noise_band
from posttrain.score.passat import category_table, pass_at

# the demo runs wear the default environment's first three categories (for the refund
# rule: with an id, without one, off topic)
_FIRST, _SECOND, _THIRD = get_env(DEFAULT_ENV).categories[:3]
# (category, scenarios, pass rate before, pass rate after): the first learns the rule,
# the second gets worse (a habit learned on the first spills over), the third stays put
GRPO_CATEGORIES = ((_FIRST, 24, 0.15, 0.70), (_SECOND, 12, 0.85, 0.45),
                   (_THIRD, 8, 0.90, 0.92))
DPO_CATEGORIES = ((_FIRST, 24, 0.12, 0.40), (_SECOND, 12, 0.95, 0.97),
                  (_THIRD, 8, 0.92, 0.98))

TRAINING_METRICS = ("reward", "reward_std", "kl", "completion_length", "loss", "grad_norm",
                    "learning_rate")
MONITOR_METRICS = ("monitor/proxy_reward", "monitor/pass_at_1", "monitor/length")


def _progress(step: int, total: int) -> float:
    """Learning progress in [0, 1]: a logistic in step / total, centred at 40%."""
    return 1.0 / (1.0 + math.exp(-10.0 * (step / max(1, total) - 0.4)))


def training_metrics(step: int, total: int, rng: random.Random) -> dict[str, float]:
    """One optimizer step's metrics as TrainerCallback names them (GRPO)."""
    learned = _progress(step, total)
    reward = 0.2 + 0.5 * learned + rng.gauss(0.0, 0.06)
    return {
        "reward": min(1.0, max(0.0, reward)),
        "reward_std": max(0.0, 0.42 - 0.15 * learned + rng.gauss(0.0, 0.03)),
        "kl": max(0.0, 0.02 * learned + abs(rng.gauss(0.0, 0.002))),
        "completion_length": 28.0 + 6.0 * learned + rng.gauss(0.0, 1.5),
        "loss": rng.gauss(0.0, 0.02) + 0.0008 * learned,
        "grad_norm": abs(rng.gauss(0.6, 0.15)),
        "learning_rate": 2e-3,
    }


def monitor_metrics(step: int, total: int, rng: random.Random) -> dict[str, float]:
    """The HackMonitor's holdout numbers at ``step`` (proxy reward, pass@1, reply chars)."""
    learned = _progress(step, total)
    proxy = 0.3 + 0.4 * learned + rng.gauss(0.0, 0.03)
    return {
        "monitor/proxy_reward": proxy,
        "monitor/pass_at_1": max(0.0, min(1.0, proxy - 0.08)),
        "monitor/length": 96.0 + 30.0 * learned + rng.gauss(0.0, 4.0),
    }


def _graded_rows(categories: tuple[tuple[str, int, float, float], ...], side: int,
                 rng: random.Random, *, samples: int = 4, eval_run: int = 0) -> list[dict]:
    """Graded rows of one evaluation; ``side`` 0 uses the before rates, 1 the after."""
    rows = []
    for category, count, *rates in categories:
        for index in range(count):
            scenario = f"{category}-{index:02d}"
            # each scenario has its own difficulty around the category's rate
            rate = min(0.98, max(0.02, rates[side] + rng.gauss(0.0, 0.12)))
            for sample in range(samples):
                passed = int(rng.random() < rate)
                well_formed = 1 if passed or rng.random() < 0.93 else 0
                rows.append({
                    "prompt": f"prompt of {scenario}", "scenario_id": scenario,
                    "category": category, "sample": sample, "reply": "...",
                    "score": float(passed), "reward": passed,
                    "markers": {"well_formed": well_formed,
                                "tool_call": int(category == _FIRST or rng.random() < 0.2)},
                    "eval_run": eval_run,
                })
    return rows


def _measured(categories: tuple[tuple[str, int, float, float], ...], seed: int) -> dict[str, Any]:
    """The before/after part of a summary, computed the way
    ``posttrain.train.summary.summarize`` does."""
    rng = random.Random(seed)
    before_runs = [_graded_rows(categories, 0, rng, eval_run=repeat) for repeat in range(2)]
    after = _graded_rows(categories, 1, rng)
    noise = noise_band(before_runs)
    report = delta(before_runs[0], after, guards=("well_formed",), by="category", noise=noise,
                   seed=seed)
    return {
        "before": pass_at(before_runs[0], seed=seed).to_dict(),
        "after": pass_at(after, seed=seed).to_dict(),
        "noise": noise.to_dict(),
        "by_category_before": [group.to_dict() for group in category_table(before_runs[0])],
        "by_category_after": [group.to_dict() for group in category_table(after)],
        "delta": report.to_dict(),
        "verdict": report.verdict,
        "ok": report.ok,
    }


def _common(recipe: str, name: str, steps: int) -> dict[str, Any]:
    return {
        "recipe": recipe, "run_name": name, "status": "done", "base_model": "starter",
        "from_run": None, "learning_rate": 2e-3,
        "data": {"prompts": 163, "train": 130, "holdout": 33, "scenarios": 200},
        "stop_reason": None,
        "timings": {"data_s": 0.4, "load_s": 2.1, "before_eval_s": 21.5,
                    "train_s": round(0.7 * steps, 1), "after_eval_s": 11.2,
                    "total_s": round(35.2 + 0.7 * steps, 1)},
        "trainer": {"train_runtime": round(0.7 * steps, 1), "train_loss": 0.0009,
                    "train_steps_per_second": round(1 / 0.7, 3)},
    }


def grpo_summary(name: str = "grpo-demo", *, steps: int = 40, seed: int = 0) -> dict[str, Any]:
    """A finished GRPO run's summary: the first category moved, the second DOWN, one hack
    alarm."""
    alarms = [{"kind": "hack", "step": 30,
               "message": f"{_SECOND}: the policy is exploiting 'length', which the reward pays "
                          "for but the environment does not endorse (48 -> 131 characters); the "
                          "training reward rose +0.12 while holdout pass@1 moved -0.08",
               "details": {"category": _SECOND, "feature": "length"}}]
    return {**_common("grpo", name, steps), **_measured(GRPO_CATEGORIES, seed),
            "alarms": alarms,
            "monitor": {"checks": [], "alarms": alarms, "stopped_by": None}}


def dpo_summary(name: str = "dpo-demo", *, steps: int = 60, seed: int = 1) -> dict[str, Any]:
    """A finished DPO run's summary, with its pair report."""
    pair_report = {"pairs": 377, "prompts_seen": 130, "prompts_with_contrast": 96,
                   "constructed_pairs": 98, "constructed_cap": 113, "trl_rows": 475,
                   "min_margin": 0.5, "mean_margin": 0.83,
                   "length": {"median_delta": -4.0, "chosen_longer": 170,
                              "chosen_longer_frac": 0.45},
                   "warnings": []}
    return {**_common("dpo", name, steps), **_measured(DPO_CATEGORIES, seed), "alarms": [],
            "pair_report": pair_report}


def demo_config(recipe: str, steps: int) -> dict[str, Any]:
    """A config shaped like the recipes' ``config.json``."""
    return {
        "recipe": recipe,
        "settings": {"base_model": "starter", "steps": steps, "num_generations": 8,
                     "beta": 0.04, "loss_type": "bnpo", "monitor_every": 10, "seed": 0,
                     "eval_samples": 4, "eval_repeats": 2, "run_name": f"{recipe}-demo"},
        "resolved": {"learning_rate": 2e-3, "learning_rate_source": "default for model size",
                     "base_parameters": 10_100_000, "device": "cpu", "dtype": "float32"},
        "data": {"source": "template writer", "split": "by scenario", "train": 130,
                 "holdout": 33},
        "versions": {"python": "3.11", "posttrain": "0.1.0"},
    }


def write_finished_run(store: Any, name: str, *, recipe: str = "grpo", steps: int = 40,
                       seed: int = 0, started: float | None = None) -> dict[str, Any]:
    """Write a whole finished run (curves, monitor points, alarm, summary); returns the summary.

    ``store`` is any run store (``SqliteRunStore``, ``HttpRunStore``).
    """
    rng = random.Random(seed)
    start = time.time() - steps - 60 if started is None else started
    store.create_run(name, demo_config(recipe, steps), started=start)
    for step in range(1, steps + 1):
        moment = start + step
        if recipe == "dpo":
            learned = _progress(step, steps)
            values = {"loss": 0.69 - 0.4 * learned + rng.gauss(0, 0.03),
                      "rewards/margins": 1.5 * learned + rng.gauss(0, 0.1),
                      "rewards/accuracies": min(1.0, 0.5 + 0.45 * learned + rng.gauss(0, 0.05)),
                      "rewards/chosen": 0.5 * learned, "rewards/rejected": -learned}
        else:
            values = training_metrics(step, steps, rng)
        store.log_metrics(name, step, values, moment)
        if recipe == "grpo" and step % 10 == 0:
            store.log_metrics(name, step, monitor_metrics(step, steps, rng), moment)
        store.set_progress(name, step, steps, 0.0, moment)
    summary = grpo_summary(name, steps=steps, seed=seed) if recipe == "grpo" else \
        dpo_summary(name, steps=steps, seed=seed)
    for alarm in summary["alarms"]:
        store.add_alarm(name, alarm["kind"], alarm["step"], alarm["message"], alarm["details"],
                        start + alarm["step"])
    store.add_note(name, "holdout evaluated after training", steps, start + steps + 30)
    store.finish_run(name, summary, "done", start + steps + 40)
    return summary


def write_long_run(store: Any, name: str, points: int = 100_000, *, seed: int = 0,
                   finished: bool = True) -> None:
    """A run with ``points`` steps of every training metric (and the monitor every 10
    steps), written in one transaction through ``store.apply``; finished unless told not."""
    rng = random.Random(seed)
    start = time.time() - points
    ops: list[dict[str, Any]] = [{"op": "create", "run": name, "time": start,
                                  "config": demo_config("grpo", points)}]
    for step in range(1, points + 1):
        values = training_metrics(step, points, rng)
        if step % 10 == 0:
            values.update(monitor_metrics(step, points, rng))
        ops.append({"op": "metrics", "run": name, "step": step, "metrics": values,
                    "time": start + step})
    ops.append({"op": "progress", "run": name, "step": points, "total": points, "eta": 0.0,
                "time": start + points})
    ops.append({"op": "alarm", "run": name, "kind": "length", "step": points // 2,
                "message": "holdout replies grew from 96 to 150 characters while the proxy "
                           "reward moved +0.001", "details": {}, "time": start + points // 2})
    if finished:
        ops.append({"op": "finish", "run": name, "status": "done", "time": start + points,
                    "summary": grpo_summary(name, steps=points, seed=seed)})
    store.apply(ops)
