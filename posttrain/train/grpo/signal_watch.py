"""Groups with no signal: how much of each GRPO step had nothing to learn from.

GRPO's advantage is a reply's reward relative to its group; a group whose replies all
score the same has zero advantage and contributes no gradient. TRL logs the share of
such groups (``frac_reward_zero_std``) and the mean within-group spread (``reward_std``)
every step. ``SignalWatch`` keeps both (and the mean reward), raises one ``no_signal``
alarm when most groups are dead for several steps in a row and the run did not learn its
way there (``posttrain.train.grpo.alarms.no_signal_alarm``), and
sums the run up for the report: a run that reads flat because its groups carried no
signal says so instead of just reading flat.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback as HFTrainerCallback

from posttrain.train.grpo.alarms import AlarmRules, no_signal_alarm


class SignalWatch(HFTrainerCallback):
    """A TrainerCallback reading each logged step's dead-group share and reward spread."""

    def __init__(self, run: Any, rules: AlarmRules | None = None) -> None:
        self.run = run
        self.rules = rules or AlarmRules()
        self.dead_shares: list[float] = []
        self.spreads: list[float] = []
        self.rewards: list[float] = []
        self.alarms: list[dict[str, Any]] = []

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
        if self.alarms:
            return  # once per run
        alarm = no_signal_alarm(state.global_step, self.dead_shares, self.rules,
                                self.rewards if len(self.rewards) == len(self.dead_shares)
                                else None)
        if alarm is not None:
            self.alarms.append(alarm.to_dict())
            self.run.alarm(alarm.kind, alarm.step, alarm.message, alarm.details)

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
