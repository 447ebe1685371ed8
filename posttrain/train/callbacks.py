"""Callbacks that connect a Hugging Face trainer (TRL's GRPO and DPO) to a posttrain run.

``TrainerCallback(run)`` forwards what the trainer logs to the run store under stable
names (``METRIC_NAMES``: TRL's key on the left, ours on the right), reports progress
with an ETA after every optimizer step, and keeps the trainer's end-of-training numbers
(runtime, throughput, mean train loss) for the summary. It never finishes the run on
its own: a recipe evaluates the holdout after training and finishes the run with the
before/after summary via ``callback.finish(summary, status)`` (or ``run.finish``).

Differences from the reference SDK's callback (reference/whileai.md section 12): DPO's
``logps/*`` and ``logits/*`` are kept (the reference dropped them although its README
promised log-probabilities), and a numeric key missing from the table is forwarded
under its own name instead of being dropped, so a new TRL metric shows up un-renamed
rather than disappearing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback as HFTrainerCallback
from transformers import TrainerControl, TrainerState, TrainingArguments

from posttrain.runs.ops import clean_metrics

# TRL 1.16 logged key -> run-store metric name (keys from reference/spike.md sections 4-5).
METRIC_NAMES: dict[str, str] = {
    # both trainers
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "entropy": "entropy",
    "num_tokens": "num_tokens",
    "epoch": "epoch",
    # GRPO: the reward and its spread over each group
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "kl": "kl",  # only when beta != 0
    "step_time": "step_time",
    # GRPO: completion lengths in tokens (there is no "completion_length" key in TRL 1.16)
    "completions/mean_length": "completion_length",
    "completions/min_length": "completion_length_min",
    "completions/max_length": "completion_length_max",
    "completions/clipped_ratio": "completion_clipped_ratio",  # share cut at max length
    "completions/mean_terminated_length": "completion_terminated_length",
    "completions/min_terminated_length": "completion_terminated_length_min",
    "completions/max_terminated_length": "completion_terminated_length_max",
    # GRPO: share of tokens whose importance ratio hit the clip range
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/low_min": "clip_ratio_low_min",
    "clip_ratio/high_mean": "clip_ratio_high",
    "clip_ratio/high_max": "clip_ratio_high_max",
    "clip_ratio/region_mean": "clip_ratio_region",
    # DPO: implicit rewards, log-probabilities and logits of chosen vs rejected
    "rewards/chosen": "rewards/chosen",
    "rewards/rejected": "rewards/rejected",
    "rewards/margins": "rewards/margins",
    "rewards/accuracies": "rewards/accuracies",
    "logps/chosen": "logps/chosen",
    "logps/rejected": "logps/rejected",
    "logits/chosen": "logits/chosen",
    "logits/rejected": "logits/rejected",
    "mean_token_accuracy": "token_accuracy",
}

# logged once when training ends; they describe the whole run, so they go to the summary
END_OF_TRAINING_KEYS = frozenset(
    {
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "total_flos",
        "train_loss",
    }
)


def map_trainer_logs(logs: Mapping[str, Any]) -> dict[str, float]:
    """Trainer log entries renamed by ``METRIC_NAMES``; other numeric keys keep their name.

    Non-numeric and non-finite values and the end-of-training keys are left out.
    """
    renamed = {
        METRIC_NAMES.get(key, key): value
        for key, value in logs.items()
        if key not in END_OF_TRAINING_KEYS
    }
    return clean_metrics(renamed)


class TrainerCallback(HFTrainerCallback):
    """Forward a trainer's logs and progress to ``run`` (a ``RunHandle`` or ``NullRun``).

    ``total_steps``: the step count progress is measured against; None uses the
    trainer's ``state.max_steps``. ``clock`` returns seconds (monotonic), swappable in
    tests. Only the main process of a multi-process run writes.
    """

    def __init__(
        self,
        run: Any,
        *,
        total_steps: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run = run
        self.total_steps = total_steps
        self.clock = clock
        self.trainer_summary: dict[str, float] = {}
        self._first_step: tuple[int, float] | None = None  # (step, time) of the first step end
        self._start: tuple[int, float] | None = None  # (step, time) at train begin

    def _total(self, state: TrainerState) -> int | None:
        total = self.total_steps or state.max_steps
        return int(total) if total else None

    def eta_seconds(self, step: int, total: int | None) -> float | None:
        """Seconds left, from the mean step time so far; None until it can be estimated.

        Measured from the end of the first step when possible, because the first step
        pays for warm-up (compilation, caches) and would inflate the estimate.
        """
        if total is None:
            return None
        now = self.clock()
        if self._first_step is not None and step > self._first_step[0]:
            done_step, done_time = self._first_step
        elif self._start is not None and step > self._start[0]:
            done_step, done_time = self._start
        else:
            return None
        per_step = (now - done_time) / (step - done_step)
        return max(0.0, per_step * (total - step))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Remember when training started and report step 0 (or the resumed step)."""
        self._start = (state.global_step, self.clock())
        self._first_step = None
        if state.is_world_process_zero:
            self.run.progress(state.global_step, self._total(state), None)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report progress with an ETA after each optimizer step."""
        step = state.global_step
        if self._first_step is None:
            self._first_step = (step, self.clock())
            if self._start is None:
                self._start = self._first_step
        if state.is_world_process_zero:
            total = self._total(state)
            self.run.progress(step, total, self.eta_seconds(step, total))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Forward the logged metrics at ``state.global_step`` under their stable names."""
        if not logs or not state.is_world_process_zero:
            return
        self.trainer_summary.update(
            clean_metrics({key: logs[key] for key in END_OF_TRAINING_KEYS if key in logs})
        )
        metrics = map_trainer_logs(logs)
        if metrics:
            self.run.log(state.global_step, metrics)

    def finish(self, summary: Mapping[str, Any] | None = None, status: str = "done") -> None:
        """Finish the run with ``summary`` (plus the trainer's end-of-training numbers under
        ``"trainer"``, unless the summary has that key) and ``status`` (done/failed/stopped)."""
        merged = dict(summary or {})
        if self.trainer_summary and "trainer" not in merged:
            merged["trainer"] = dict(self.trainer_summary)
        self.run.finish(merged, status=status)
