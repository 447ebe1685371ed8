"""An SFT run from its settings to its summary: the recipe's five phases in order
(``posttrain.train.recipe``), the plan (``posttrain.train.plan``: the trainer's precision
and the verdict's guards) after the baseline, the step (``train_sft`` in ``trainer.py``)
in the middle."""

from __future__ import annotations

from typing import Any

from posttrain.train import recipe
from posttrain.train.plan import plan_trainer, say_plan
from posttrain.train.sft.settings import SFTSettings
from posttrain.train.sft.trainer import train_sft


def run_sft(settings: SFTSettings, *, say: Any = print) -> dict[str, Any]:
    """Run the SFT recipe end to end; returns the summary (also in summary.json).

    The recipe's phases in order (``posttrain.train.recipe``), its own step in the middle."""
    prepared = recipe.prepare("sft", settings, say=say)
    context = recipe.load(prepared)
    with recipe.finishing(context) as measured:
        measured.before = recipe.baseline(context)
        plan = plan_trainer(context, measured.before.rows)  # its precision and guards
        measured.notes["plan"] = say_plan(context, plan)
        if not plan.plan_only:
            with recipe.timed(context, "train_s"):
                measured.outcome = train_sft(context, plan)
            measured.after = recipe.evaluate_trained(context, measured.outcome)
    return measured.summary
