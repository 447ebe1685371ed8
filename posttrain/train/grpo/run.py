"""A GRPO run from its settings to its summary: the recipe's five phases in order
(``posttrain.train.recipe``), with the run's plan made after the base's first evaluation
(``plan.py``: every automatic choice, said as one block) and GRPO's supervised cold start
between the baseline and the step when the plan says so.

Read top to bottom, this is the whole route of a ``posttrain grpo`` run: the plan is in
``plan.py``, the cold start in ``cold_start.py``, the step itself (``train_grpo``) in
``trainer.py``.
"""

from __future__ import annotations

from typing import Any

from posttrain.train import recipe
from posttrain.train.grpo.cold_start import run_cold_start
from posttrain.train.grpo.plan import plan_grpo
from posttrain.train.grpo.settings import GRPOSettings
from posttrain.train.grpo.trainer import train_grpo
from posttrain.train.plan import say_plan


def run_grpo(settings: GRPOSettings, *, say: Any = print) -> dict[str, Any]:
    """Run the GRPO recipe end to end; returns the summary (also in summary.json)."""
    prepared = recipe.prepare("grpo", settings, say=say)
    context = recipe.load(prepared)
    with recipe.finishing(context) as measured:
        first = recipe.evaluate_base(context, 1)  # the evidence the plan reads
        plan = plan_grpo(context, first)
        measured.before = recipe.settle_baseline(
            context, recipe.evaluate_base_to(context, first, plan.base_evaluations_now()))
        measured.notes.update(plan=say_plan(context, plan), cold_start=plan.cold_start_record())
        if not plan.plan_only:
            if plan.cold_start.run:
                with recipe.timed(context, "cold_start_s"):
                    cold = run_cold_start(context, plan, measured.before)
                measured.cold_start = cold.evaluation
                measured.notes["cold_start"].update(cold.to_dict())
            with recipe.timed(context, "train_s"):
                measured.outcome = train_grpo(context, plan)
            measured.after = recipe.evaluate_trained(context, measured.outcome)
    return measured.summary
