"""A DPO run from its settings to its summary: the recipe's five phases in order
(``posttrain.train.recipe``), the plan (``posttrain.train.plan``: the trainer's precision
and the verdict's guards) after the baseline, the step (``train_dpo`` in ``trainer.py``)
in the middle."""

from __future__ import annotations

from typing import Any

from posttrain.train import recipe
from posttrain.train.dpo.settings import DPOSettings
from posttrain.train.dpo.trainer import train_dpo
from posttrain.train.plan import plan_trainer, say_plan


def run_dpo(settings: DPOSettings, *, say: Any = print) -> dict[str, Any]:
    """Run the DPO recipe end to end; returns the summary (also in summary.json).

    The recipe's phases in order (``posttrain.train.recipe``), its own step in the middle."""
    prepared = recipe.prepare("dpo", settings, say=say)
    context = recipe.load(prepared)
    with recipe.finishing(context) as measured:
        measured.before = recipe.baseline(context)
        plan = plan_trainer(context, measured.before.rows)  # its precision and guards
        measured.notes["plan"] = say_plan(context, plan)
        if not plan.plan_only:
            with recipe.timed(context, "train_s"):
                measured.outcome = train_dpo(context, plan)
            measured.after = recipe.evaluate_trained(context, measured.outcome)
    return measured.summary
