"""Where a GRPO step's time goes, phase by phase, in TRL's own training path.

TRL logs one ``step_time`` per step (and reports its finer profiling only to wandb, mlflow
or trackio). To say which phase to make faster, and how far each is from what the machine
can do (``benchmarks/real_weights.py``), ``time_phases`` wraps a few of the trainer's own
methods on one trainer and logs, per step, beside ``step_time``:

==================  ========================================================================
metric              what it times
==================  ========================================================================
generation_time     sampling the completions (TRL's ``_generate``)
reward_time         the reward functions (posttrain's rule) on them
scoring_time        the rest of preparing the batch: tokenizing, the old/reference
                    logprob forward passes (when the config needs them), advantages
loss_forward_time   the loss: the policy's logprob forward with autograd, and the loss
backward_time       its backward pass
optimizer_time      the optimizer step (AdamW; gradient clipping counts as bookkeeping)
==================  ========================================================================

Whatever is left of ``step_time`` plus ``optimizer_time`` is the trainer's own
bookkeeping. ``peak_rss_gib`` is the process's peak resident memory at the end of each
step (a peak set earlier, say by the evaluation before training, shows until passed). A
TRL whose methods are named otherwise logs none of these (``phase_shares`` then answers
None).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

# (metric, words for the summary line), in the order a step runs them
PHASES = (("generation_time", "generation"), ("scoring_time", "scoring"),
          ("reward_time", "rewards"), ("loss_forward_time", "loss forward"),
          ("backward_time", "backward"), ("optimizer_time", "optimizer"))
_WRAPPED = ("_generate", "_calculate_rewards", "_prepare_inputs", "compute_loss",
            "training_step")


class _StepClock:
    """Seconds spent in each wrapped method since the current training step began."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - started
        return call


def time_phases(trainer: Any) -> None:
    """Log the phases of each of ``trainer``'s (a ``trl.GRPOTrainer``) steps as metrics
    (module docstring); leaves a trainer without those methods as it is."""
    metrics = getattr(trainer, "_metrics", {}).get("train")
    if metrics is None or not all(callable(getattr(trainer, name, None)) for name in _WRAPPED):
        return
    clock = _StepClock()
    for name in ("_generate", "_calculate_rewards", "_prepare_inputs", "compute_loss"):
        setattr(trainer, name, clock.timed(name, getattr(trainer, name)))
    step = clock.timed("training_step", trainer.training_step)

    totals: dict[str, float] = {}

    def training_step(*args: Any, **kwargs: Any) -> Any:
        clock.spent.clear()
        result = step(*args, **kwargs)
        spent = clock.spent
        generation = spent.get("_generate", 0.0)
        rewards = spent.get("_calculate_rewards", 0.0)
        preparing = spent.get("_prepare_inputs", 0.0)
        loss = spent.get("compute_loss", 0.0)
        for metric, seconds in (
                ("generation_time", generation), ("reward_time", rewards),
                ("scoring_time", max(0.0, preparing - generation - rewards)),
                ("loss_forward_time", loss),
                ("backward_time", max(0.0, spent["training_step"] - preparing - loss))):
            totals[metric] = totals.get(metric, 0.0) + seconds
        # an optimizer step may take several passes (--micro-batch): one sum per step, as
        # TRL's step_time (its training_step counts the passes in _step)
        passes = max(1, int(getattr(trainer, "current_gradient_accumulation_steps", 1)))
        if int(getattr(trainer, "_step", 0)) % passes == 0:
            for metric, seconds in totals.items():
                metrics[metric].append(seconds)
            totals.clear()
            metrics["peak_rss_gib"].append(peak_rss_gib())
        return result

    trainer.training_step = training_step
    trainer.add_callback(_optimizer_timer(metrics))


def peak_rss_gib() -> float:
    """The process's peak resident memory so far, in GiB (0 where it cannot be read)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**30 if sys.platform == "darwin" else 2**20), 3)  # bytes / KiB


def _optimizer_timer(metrics: Any) -> Any:
    """A transformers callback timing the optimizer step (between its two events)."""
    from transformers import TrainerCallback

    class OptimizerTimer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                                  **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
            metrics["optimizer_time"].append(time.perf_counter() - self.started)

    return OptimizerTimer()


def phase_shares(history: list[dict[str, Any]]) -> dict[str, float] | None:
    """Each phase's share of the steps' time over a run's log history (``step_time`` plus
    the optimizer step, which TRL's ``step_time`` leaves out), and ``other`` for the rest;
    None when the phases were not logged."""
    steps = [entry for entry in history if isinstance(entry.get("step_time"), (int, float))
             and all(isinstance(entry.get(metric), (int, float)) for metric, _ in PHASES)]
    total = sum(entry["step_time"] + entry["optimizer_time"] for entry in steps)
    if not steps or total <= 0:
        return None
    shares = {words: sum(entry[metric] for entry in steps) / total for metric, words in PHASES}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return {words: round(share, 4) for words, share in shares.items()}


def phases_line(shares: dict[str, float]) -> str:
    """``step time: generation 61%, scoring 4%, ...`` for the console."""
    return "step time: " + ", ".join(f"{words} {share:.0%}" for words, share in shares.items())
