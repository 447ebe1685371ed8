"""A run's plan: every automatic choice a recipe makes, made once, after the base policy's
first evaluation and before any training, and said as one block.

A recipe decides things a user did not spell out: whether to cold-start, in what
precision to train, which sampler draws the rollouts, which guards the verdict reads. Made
one by one as the run reaches them, the last of them 20 minutes in on real weights, they
cannot be asked for ahead of time and they can drift (a setting rewritten half way). So
each recipe has one planning function (``plan_grpo`` in ``grpo/plan.py``;
``plan_trainer`` here for SFT and DPO, whose only choices are the precision and the
guards) that makes all of them from the run's settings, its loaded policy and the base's
rows, and returns a frozen plan. Nothing changes the settings or the data after it: the
step takes the plan (``train_grpo(context, plan)``).

``say_plan`` prints it (``plan:`` then one line a choice: what, the choice, why, and the
counts or times it rests on), notes each line in the run store, and writes it once to
``config.json`` (with the settings and data as planned, so ``--config`` on the folder's
``config.json`` runs the same again); ``finishing`` puts it in ``summary.json``.
``--plan-only`` ends the run there: the baseline ran, nothing trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic

from posttrain.score.delta import RUN_GUARDS
from posttrain.score.guards import choose_guards
from posttrain.train import recipe
from posttrain.train.context import RecipeContext, SettingsT
from posttrain.train.precision import PrecisionChoice, precision_for


@dataclass(frozen=True)
class PlanLine:
    """One automatic choice: what was chosen, the choice, why, and the evidence (counts,
    times) it rests on."""

    what: str  # "cold start", "precision", ...
    choice: str  # "none", "float32", ...
    why: str
    evidence: str = ""  # the counts or times the choice rests on
    effect: str = ""  # what the choice sets, when it sets anything

    def words(self) -> str:
        return (f"{self.what}: {self.choice} ({self.why})"
                + (f"; {self.effect}" if self.effect else "")
                + (f" [evidence: {self.evidence}]" if self.evidence else ""))

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "choice": self.choice, "why": self.why,
                "evidence": self.evidence, "effect": self.effect}


def plan_block(lines: Sequence[PlanLine]) -> list[str]:
    """The plan as the console prints it: ``plan:`` then one indented line a choice."""
    return ["plan:", *(f"  {line.words()}" for line in lines)]


def guard_line(rows: Sequence[dict[str, Any]], *, on: str) -> PlanLine:
    """The verdict's guards as ``choose_guards`` picks them from ``rows`` (the rows the
    verdict's "before" side will be, or the nearest the plan has: ``on`` says which)."""
    guards = choose_guards(rows, RUN_GUARDS)
    names = ", ".join(guards.names) or "none"
    why = "; ".join(guards.notes) or "the default guard can fail on these rows"
    return PlanLine("guards", names, why, f"{len(rows)} replies of {on}")


def precision_line(precision: PrecisionChoice) -> PlanLine:
    """The precision as a plan line (a measured choice says its times in its reason)."""
    return PlanLine("precision", "bf16 autocast" if precision.bf16 else "float32",
                    precision.reason)


@dataclass(frozen=True)
class TrainerPlan(Generic[SettingsT]):
    """The plan of a recipe that chooses only its trainer's precision and the verdict's
    guards (SFT, DPO)."""

    settings: SettingsT
    precision: PrecisionChoice
    guards: PlanLine
    plan_only: bool = False

    def lines(self) -> list[PlanLine]:
        return [precision_line(self.precision), self.guards]

    def to_dict(self) -> dict[str, Any]:
        return {"choices": [line.to_dict() for line in self.lines()],
                "precision": self.precision.to_dict(), "plan_only": self.plan_only}

    def config_entries(self) -> dict[str, Any]:
        """What the plan adds to ``config.json`` beside itself."""
        return {"precision": self.precision.to_dict()}


def plan_trainer(context: RecipeContext[SettingsT], before_rows: Sequence[dict[str, Any]]
                 ) -> TrainerPlan[SettingsT]:
    """SFT's and DPO's plan: the precision for this policy on this machine, and the
    guards the verdict reads on the base's rows."""
    settings = context.settings
    return TrainerPlan(
        settings=settings,
        precision=precision_for(settings.precision, context.policy, say=context.say),
        guards=guard_line(before_rows, on="the base's evaluations"),
        plan_only=settings.plan_only)


def say_plan(context: RecipeContext[Any], plan: Any) -> dict[str, Any]:
    """Print the plan as one block, note each line in the run store, write it once to
    ``config.json`` (with what it sets beside it: ``plan.config_entries()``); returns its
    record for the summary."""
    lines = plan.lines()
    for text in plan_block(lines):
        context.say(text)
    for line in lines:
        context.run.note(f"plan: {line.words()}")
    record = plan.to_dict()
    recipe.record_in_config(context, plan=record, **plan.config_entries())
    if plan.plan_only:
        context.say("plan only (--plan-only): the baseline ran; nothing trains. Run without "
                    "--plan-only to train as planned")
    return record
