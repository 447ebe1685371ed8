"""A GRPO run from its settings to its summary: the recipe's five phases in order
(``posttrain.train.recipe``), with GRPO's supervised cold start between the baseline and
the step when the base gives RL nothing to learn from (``cold_start_choice``).

Read top to bottom, this is the whole route of a ``posttrain grpo`` run: the step itself
(``train_grpo``) is in ``trainer.py``, the cold start in ``cold_start.py``.
"""

from __future__ import annotations

from typing import Any

from posttrain.train import recipe
from posttrain.train.grpo.cold_start import run_cold_start
from posttrain.train.grpo.cold_start_choice import choose_cold_start
from posttrain.train.grpo.cold_start_shape import shape_run
from posttrain.train.grpo.settings import GRPOSettings
from posttrain.train.grpo.trainer import train_grpo


def run_grpo(settings: GRPOSettings, *, say: Any = print) -> dict[str, Any]:
    """Run the GRPO recipe end to end; returns the summary (also in summary.json).

    The recipe's phases in order (``posttrain.train.recipe``), its own step in the middle,
    after a supervised cold start when ``--cold-start`` asks for one
    (``posttrain.train.grpo.cold_start``)."""
    prepared = recipe.prepare("grpo", settings, say=say)
    context = recipe.load(prepared)
    with recipe.finishing(context) as measured:
        # the base's first evaluation decides the cold start; its other repeats (the noise
        # band of RL's baseline) only matter when the base stays RL's baseline
        before = recipe.evaluate_base(context, 1)
        choice = choose_cold_start(settings.cold_start, context.env, before.rows,
                                   from_run=settings.from_run)
        if not choice.run and settings.eval_repeats > 1:
            before = before.joined(recipe.evaluate_base(context, settings.eval_repeats - 1,
                                                        first_repeat=1))
            choice = choose_cold_start(settings.cold_start, context.env, before.rows,
                                       from_run=settings.from_run)
        measured.before = recipe.settle_baseline(context, before)
        # GRPO's own first phase when the base gives RL nothing to learn from
        context.say(f"cold start: {choice.reason}")
        measured.notes["cold_start"] = choice.to_dict()
        if choice.run:
            settings, shape = shape_run(context, settings, choice)
            measured.notes["cold_start"]["shape"] = shape.to_dict()
        recipe.record_in_config(context, "cold_start", measured.notes["cold_start"])
        if choice.run:
            with recipe.timed(context, "cold_start_s"):
                cold = run_cold_start(context, settings)
            measured.cold_start = cold.evaluation
            measured.notes["cold_start"].update(cold.to_dict())
        with recipe.timed(context, "train_s"):
            measured.outcome = train_grpo(context, settings, cold_started=choice.run)
        measured.after = recipe.evaluate_trained(context, measured.outcome)
    return measured.summary
