"""Groups with no signal: how much of each GRPO step had nothing to learn from.

GRPO's advantage is a reply's reward relative to its group; a group whose replies all
score the same has zero advantage and contributes no gradient. TRL logs the share of
such groups (``frac_reward_zero_std``) and the mean within-group spread (``reward_std``)
every step. ``SignalWatch`` keeps both (and the mean reward), raises one ``no_signal``
alarm when most groups are dead for several steps in a row and the run did not learn its
way there (``posttrain.train.grpo.alarms.no_signal_alarm``), and
sums the run up for the report: a run that reads flat because its groups carried no
signal says so instead of just reading flat.

The same reading ends a run that has nothing left to learn (``--stop-when-solved N``): a
step is *solved* when every group scored alike and every completion of the step passed the
environment's rule; after N solved steps in a row that between them drew prompts of every
category of the train set, training stops. With no advantage
anywhere the loss is the KL term alone, which only pulls the policy back toward the
reference, so the remaining steps cost time and can only undo (the SmolLM2 runs of
benchmarks/RESULTS.md spent their last 15-20 of 40 steps so).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback as HFTrainerCallback

from posttrain.envs.base import passes
from posttrain.train.distributed import Ranks, all_true
from posttrain.train.grpo.alarms import AlarmRules, no_signal_alarm


def solved_step(dead_share: float, rows: list[dict[str, Any]]) -> bool | None:
    """Whether one step had nothing left to learn: every group scored alike and every
    completion (``rows``: the rewards' rows of the step) passed the environment's rule
    (its own score where the run trains on another reward). None when the step scored no
    rows here (nothing to judge it by)."""
    if not rows:
        return None
    return dead_share >= 1.0 and all(
        passes(float(row.get("rule_score", row["score"]))) for row in rows)


class SignalWatch(HFTrainerCallback):
    """A TrainerCallback reading each logged step's dead-group share and reward spread;
    with ``stop_when_solved`` and the ``reward`` whose rows it reads, it ends training
    after that many solved steps in a row (module docstring)."""

    def __init__(self, run: Any, rules: AlarmRules | None = None, *,
                 reward: Any = None, stop_when_solved: int = 0,
                 ranks: Ranks | None = None, trained_before: bool = False,
                 categories: frozenset[str] = frozenset()) -> None:
        self.run = run
        self.rules = rules or AlarmRules()
        self.reward = reward
        self.stop_when_solved = stop_when_solved if reward is not None else 0
        self.ranks = ranks or Ranks()
        self.trained_before = trained_before  # see alarms.no_signal_alarm
        # the train prompts' categories: a solved streak counts only once it has seen each
        # (four prompts a step can miss a small category for five steps running)
        self.categories = categories
        self._streak_categories: set[str] = set()
        self._stopped_streak = 0
        self.dead_shares: list[float] = []
        self.spreads: list[float] = []
        self.rewards: list[float] = []
        self.alarms: list[dict[str, Any]] = []
        self.solved_streak = 0
        self.stopped_at: int | None = None  # the step after which training stopped, solved
        self._rows_seen = len(reward.history) if reward is not None else 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        logs = logs or {}
        if "frac_reward_zero_std" not in logs:
            return  # not a training step's log (the end-of-training summary, say)
        self.dead_shares.append(float(logs["frac_reward_zero_std"]))
        if "reward_std" in logs:
            self.spreads.append(float(logs["reward_std"]))
        if "reward" in logs:
            self.rewards.append(float(logs["reward"]))
        if self.stop_when_solved:
            self._watch_for_solved(state.global_step, control)
        if self.alarms:
            return  # once per run
        alarm = no_signal_alarm(state.global_step, self.dead_shares, self.rules,
                                self.rewards if len(self.rewards) == len(self.dead_shares)
                                else None, trained_before=self.trained_before)
        if alarm is not None:
            self.alarms.append(alarm.to_dict())
            self.run.alarm(alarm.kind, alarm.step, alarm.message, alarm.details)

    def _watch_for_solved(self, step: int, control: Any) -> None:
        """Count solved steps in a row; after ``stop_when_solved`` of them, end training
        (every process decides on its own rows, and all stop only when all agree)."""
        rows = self.reward.history[self._rows_seen:]
        self._rows_seen = len(self.reward.history)
        solved = solved_step(self.dead_shares[-1], rows)
        if solved is None:
            return
        if solved:
            self.solved_streak += 1
            self._streak_categories.update(str(row.get("category")) for row in rows)
        else:
            self.solved_streak = 0
            self._streak_categories = set()
        enough = (self.solved_streak >= self.stop_when_solved
                  and self.categories <= self._streak_categories)
        if all_true(enough, self.ranks) and self.stopped_at is None:
            self.stopped_at = step
            self._stopped_streak = self.solved_streak
            control.should_training_stop = True

    def stop_line(self, steps: int) -> str | None:
        """The console's line when training ended early, solved (None otherwise)."""
        if self.stopped_at is None or self.stopped_at >= steps:
            return None
        return (f"training: stopped after step {self.stopped_at} of {steps}: every completion "
                f"of the last {self._stopped_streak} steps passed the rule and every group "
                "scored alike"
                + (", prompts of every category among them" if self.categories else "")
                + " (no advantage left; more steps would only pull the policy back toward "
                "the reference; --stop-when-solved 0 runs them all)")

    def summary(self) -> dict[str, Any] | None:
        """Mean share of dead groups and mean within-group spread over the logged steps."""
        if not self.dead_shares:
            return None
        return {
            "steps": len(self.dead_shares),
            "dead_group_share": round(sum(self.dead_shares) / len(self.dead_shares), 4),
            "reward_spread": (round(sum(self.spreads) / len(self.spreads), 4)
                              if self.spreads else None),
            "alarm": bool(self.alarms),
            **({"solved_at": self.stopped_at} if self.stopped_at is not None else {}),
        }

    def describe(self) -> str | None:
        """One line for the console and the report."""
        summary = self.summary()
        if summary is None:
            return None
        spread = ("" if summary["reward_spread"] is None
                  else f", mean within-group reward spread {summary['reward_spread']:.2f}")
        return (f"signal: {summary['dead_group_share']:.0%} of groups had all-equal rewards "
                f"(no advantage) over {summary['steps']} steps{spread}")
