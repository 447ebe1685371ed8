"""``posttrain grpo``: the GRPO recipe end to end (the project's main job)."""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.commands.recipe_command import register_recipe_command
from posttrain.train.grpo.settings import GRPOSettings

DESCRIPTION = """\
GRPO on one testable rule, end to end: write the prompts (or read --prompts-file),
hold out 20% of scenarios, evaluate the base policy on the holdout (--eval-repeats
times, for the noise band), cold-start it with SFT on the reference agent's replies when
it gives RL nothing to reinforce (--cold-start; the base is then evaluated once and the
cold-started policy --eval-repeats times), train a LoRA adapter with TRL's GRPOTrainer against the
environment's rule reward, evaluate again on the same holdout, and print the paired
delta with its interval and verdict, the guard check and the table by category.
Everything lands in <runs>/<run-name>/ (config.json, summary.json, holdout rows,
adapter/, report.md, curves.png). Exit status: 0 done, 1 a guard fell, 2 bad input, 130 Ctrl-C,
143 SIGTERM."""


def run_grpo(settings: GRPOSettings) -> dict[str, Any]:
    """Run the recipe; returns its summary."""
    # the trainer needs the train extra (torch, transformers, trl): loaded when a run starts,
    # so `posttrain --help` and the other commands work without it
    from posttrain.train.grpo.run import run_grpo as run_recipe

    return run_recipe(settings)


def register(subparsers: argparse._SubParsersAction) -> None:
    register_recipe_command(
        subparsers,
        name="grpo",
        help="train with GRPO (LoRA, TRL) and report before/after with intervals",
        description=DESCRIPTION,
        settings_class=GRPOSettings,
        run_recipe=run_grpo,
    )
