"""A GRPO run's plan (``plan_grpo``): every automatic choice of the run, made once from
the base policy's first evaluation and before any training (``posttrain.train.plan``).

The choices, in the order the run meets them:

1. **baseline**: how many evaluations of the base the run takes (``--eval-repeats``, or
   one when a cold start follows: RL's baseline is then the cold-started policy);
2. **cold start** (``cold_start_choice``): whether a supervised cold start runs first,
   from the categories whose pass rate the first evaluation *shows* low;
3. **cold start shape** (``cold_start_shape``): full or light, and the settings it sets;
   the run's settings and RL's train prompts under the plan are the plan's own copies
   (``GRPOPlan.settings``, ``GRPOPlan.train``): nothing rewrites the context's;
4. **precision** (``posttrain.train.precision``), for the cold start and RL alike;
5. **rollouts** (``rollout.choose_rollout``) and **shared prefix**
   (``shared_prefix.choose_shared_prefix``);
6. **dynamic sampling** (``--resample-dead-groups``);
7. **stop rule**: the steps, the solved-steps stop (``signal_watch``), the alarms that stop
   the run and how often the hack monitor looks;
8. **guards** (``posttrain.score.guards``): on the base's rows, or, after a cold start, on
   the cold-started policy's rows (the verdict's "before" side), which the plan names but
   cannot read yet.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from posttrain.envs.base import is_multi_turn
from posttrain.policy.model_agent import keeps_trl_numbers
from posttrain.train.context import RecipeContext
from posttrain.train.grpo.cold_start_choice import (
    LOW_PASS_MARK,
    ColdStartChoice,
    choose_cold_start,
)
from posttrain.train.grpo.cold_start_shape import ColdStartShape, shape_settings, shaped_train
from posttrain.train.grpo.rollout import RolloutChoice, choose_rollout
from posttrain.train.grpo.settings import GRPOSettings
from posttrain.train.grpo.shared_prefix import SharedPrefixChoice, choose_shared_prefix
from posttrain.train.measure import PolicyEvaluation
from posttrain.train.plan import PlanLine, guard_line, precision_line
from posttrain.train.precision import PrecisionChoice, precision_for


@dataclass(frozen=True)
class GRPOPlan:
    """Every automatic choice of a GRPO run (module docstring); frozen once made."""

    settings: GRPOSettings  # the run's settings under the plan (the shape's applied)
    train: tuple[dict[str, Any], ...]  # RL's train prompts under the plan
    base_evaluations: int
    cold_start: ColdStartChoice
    shape: ColdStartShape
    precision: PrecisionChoice
    rollout: RolloutChoice
    shared_prefix: SharedPrefixChoice
    guards: PlanLine
    train_note: str = ""  # how the shape changed RL's train prompts, when it did
    plan_only: bool = False

    def lines(self) -> list[PlanLine]:
        """One line a choice, in the order the run meets them."""
        settings = self.settings
        bounds = ", ".join(f"{category.name} {category.pass_upper_bound():.2f}"
                           for category in self.cold_start.signal)
        signal = (f"pass rates' upper bounds {bounds} (shown low under {LOW_PASS_MARK:g})"
                  if bounds else "")
        lines = [
            PlanLine("baseline", f"{self.base_evaluations} evaluation"
                     + ("s" if self.base_evaluations > 1 else "") + " of the base",
                     "a cold start follows: RL's baseline is the cold-started policy, "
                     f"evaluated {settings.eval_repeats} times" if self.cold_start.run else
                     "the base is RL's baseline; its repeats give the noise band"),
            PlanLine("cold start", self.cold_start.name,
                     self.cold_start.reason, signal),
        ]
        if self.cold_start.run:
            effect = "; ".join(part for part in (self.shape.changes(), self.train_note) if part)
            lines.append(PlanLine("cold start shape", self.shape.name, self.shape.reason,
                                  effect=effect))
        lines += [
            precision_line(self.precision),
            PlanLine("rollouts", self.rollout.name, self.rollout.reason),
            PlanLine("shared prefix", "on" if self.shared_prefix.on else "off",
                     self.shared_prefix.reason),
            PlanLine("dynamic sampling",
                     f"up to {settings.resample_dead_groups} redraws of a dead group"
                     if settings.resample_dead_groups else "off",
                     f"--resample-dead-groups {settings.resample_dead_groups}"
                     + ("" if settings.resample_dead_groups else ", the default")),
            self.stop_line(),
            self.guards,
        ]
        return lines

    def base_evaluations_now(self) -> int:
        """The base evaluations the run takes: the plan's, or only the first one the plan
        read under ``--plan-only``."""
        return 1 if self.plan_only else self.base_evaluations

    def stop_line(self) -> PlanLine:
        settings = self.settings
        solved = (f", or after {settings.stop_when_solved} solved steps in a row"
                  if settings.stop_when_solved else "")
        alarms = settings.stop_on_alarms()
        monitor = (f"the hack monitor samples the holdout every {settings.monitor_every} "
                   "steps" if settings.monitor_every else "no hack monitor: --monitor-every 0")
        return PlanLine("stop", f"after {settings.steps} steps{solved}",
                        (f"alarms that stop it: {', '.join(alarms)}" if alarms
                         else "no alarm stops it: --stop-on names none") + f"; {monitor}")

    def to_dict(self) -> dict[str, Any]:
        return {"choices": [line.to_dict() for line in self.lines()],
                "base_evaluations": self.base_evaluations,
                "cold_start": self.cold_start_record(),
                "precision": self.precision.to_dict(),
                "rollout": {"sampler": self.rollout.name, "reason": self.rollout.reason},
                "shared_prefix": {"on": self.shared_prefix.on,
                                  "reason": self.shared_prefix.reason},
                "plan_only": self.plan_only}

    def cold_start_record(self) -> dict[str, Any]:
        """The cold start's choice as config.json and summary.json have always kept it."""
        record = self.cold_start.to_dict()
        if self.cold_start.run:
            record["shape"] = self.shape.to_dict()
        return record

    def config_entries(self) -> dict[str, Any]:
        """What the plan writes to ``config.json`` beside itself: the cold start, the
        precision and, when the shape set any, the settings and data as planned (so
        ``--config`` on the folder's ``config.json`` runs the same again)."""
        entries: dict[str, Any] = {"cold_start": self.cold_start_record(),
                                   "precision": self.precision.to_dict()}
        if self.shape.applied:
            counts = Counter(str(record["category"]) for record in self.train)
            entries["settings"] = self.settings.to_config()
            entries["train_prompts"] = {"prompts": len(self.train), **dict(sorted(
                counts.items()))}
        return entries


def plan_grpo(context: RecipeContext[GRPOSettings], before: PolicyEvaluation) -> GRPOPlan:
    """The run's plan from its settings, its loaded policy and ``before``, the base's
    first evaluation (module docstring). Reads the context; changes nothing in it."""
    asked = context.settings
    cold_start = choose_cold_start(asked.cold_start, context.env, before.rows,
                                   from_run=asked.from_run)
    settings, shape = shape_settings(asked.cold_start_shape, cold_start, asked)
    train = shaped_train(context.data.train, shape)
    train_note = ""
    if train is not context.data.train:
        counts = Counter(str(record["category"]) for record in train)
        train_note = (f"RL's train prompts balanced to {shape.applied['balance']:g} a "
                      f"category: {len(context.data.train)} -> {len(train)} ("
                      + ", ".join(f"{name} {counts[name]}" for name in sorted(counts)) + ")")
    trl_recorded = keeps_trl_numbers(context.policy)
    return GRPOPlan(
        settings=replace(settings),  # the plan's own copy, whatever happens to the context's
        train=tuple(train),
        base_evaluations=1 if cold_start.run else asked.eval_repeats,
        cold_start=cold_start,
        shape=shape,
        precision=precision_for(settings.precision, context.policy, say=context.say),
        rollout=choose_rollout(settings.rollout, use_vllm=settings.use_vllm,
                               multi_turn=is_multi_turn(context.env), trl_recorded=trl_recorded,
                               redraws=settings.resample_dead_groups > 0),
        shared_prefix=choose_shared_prefix(settings.shared_prefix, trl_recorded=trl_recorded,
                                           world_size=context.ranks.world),
        guards=(PlanLine("guards", "chosen after the cold start",
                         "the verdict's guards are read on RL's baseline, the cold-started "
                         "policy's rows, which the cold start writes")
                if cold_start.run else guard_line(before.rows,
                                                  on="the base's first evaluation")),
        train_note=train_note,
        plan_only=asked.plan_only,
    )
