"""An SFT run from its settings to its summary: the recipe's five phases in order
(``posttrain.train.recipe``), the step (``train_sft`` in ``trainer.py``) in the middle."""

from __future__ import annotations

from typing import Any

from posttrain.train import recipe
from posttrain.train.sft.settings import SFTSettings
from posttrain.train.sft.trainer import train_sft


def run_sft(settings: SFTSettings, *, say: Any = print) -> dict[str, Any]:
    """Run the SFT recipe end to end; returns the summary (also in summary.json).

    The recipe's phases in order (``posttrain.train.recipe``), its own step in the middle."""
    prepared = recipe.prepare("sft", settings, say=say)
    context = recipe.load(prepared)
    with recipe.finishing(context) as measured:
        measured.before = recipe.baseline(context)
        with recipe.timed(context, "train_s"):
            measured.outcome = train_sft(context, settings)
        measured.after = recipe.evaluate_trained(context, measured.outcome)
    return measured.summary
