"""``posttrain dpo``: the DPO recipe end to end, on the same prompts and holdout as GRPO."""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.commands.recipe_command import register_recipe_command
from posttrain.train.dpo.settings import DPOSettings

DESCRIPTION = """\
DPO on one testable rule, end to end: write the prompts (or read --prompts-file),
hold out 20% of scenarios, evaluate the base policy on the holdout (--eval-repeats
times, for the noise band), sample --pair-samples replies per train prompt and pair
a better reply with a worse one of similar length (or read --pairs FILE), train a
LoRA adapter with TRL's DPOTrainer (reference: the adapter switched off), evaluate
again on the same holdout, and print the paired delta with its interval and
verdict, the guard check and the table by category. --from-run RUN starts from
that run's adapter merged into its base (round two) and saves the merged policy
under merged/. Everything lands in <runs>/<run-name>/ (config.json, summary.json
with the pair report, pairs.jsonl, holdout rows, adapter/, report.md, curves.png).
Exit status: 0 done, 1 a guard fell, 2 bad input, 130 Ctrl-C, 143 SIGTERM."""


def run_dpo(settings: DPOSettings) -> dict[str, Any]:
    """Run the recipe; returns its summary."""
    # the trainer needs the train extra (torch, transformers, trl): loaded when a run starts,
    # so `posttrain --help` and the other commands work without it
    from posttrain.train.dpo.run import run_dpo as run_recipe

    return run_recipe(settings)


def register(subparsers: argparse._SubParsersAction) -> None:
    register_recipe_command(
        subparsers,
        name="dpo",
        help="train with DPO on preference pairs (LoRA, TRL) and report before/after",
        description=DESCRIPTION,
        settings_class=DPOSettings,
        run_recipe=run_dpo,
    )
