"""``posttrain sft``: the supervised cold start, on the same prompts and holdout as GRPO."""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.commands.recipe_command import register_recipe_command
from posttrain.train.sft.settings import SFTSettings

DESCRIPTION = """\
Supervised fine-tuning (SFT) on demonstrations, end to end: write the prompts (or read
--prompts-file), hold out 20% of scenarios, evaluate the base policy on the holdout
(--eval-repeats times, for the noise band), gather demonstrations (--demos reference:
the environment's reference agent answers each train prompt --demos-per-prompt times
and only replies the rule passes are kept; or --demos FILE, a JSONL of conversations),
drop any demonstration of a holdout prompt, train a LoRA adapter with TRL's SFTTrainer
(loss on the replies only), evaluate again on the same holdout, and print the paired
delta with its interval and verdict, the guard check and the table by category.

This is the cold start for a model that never makes the rule's move (every GRPO group
then scores the same and teaches nothing): follow it with
`posttrain grpo --from-run <this run's name>`, which starts from this adapter, merged.
Everything lands in <runs>/<run-name>/ (config.json, summary.json with the
demonstration report, demos.jsonl, holdout rows, adapter/, report.md, curves.png).
Exit status: 0 done, 1 a guard fell, 2 bad input, 130 Ctrl-C, 143 SIGTERM."""


def run_sft(settings: SFTSettings) -> dict[str, Any]:
    """Run the recipe; returns its summary."""
    # the trainer needs the train extra (torch, transformers, trl): loaded when a run starts,
    # so `posttrain --help` and the other commands work without it
    from posttrain.train.sft.run import run_sft as run_recipe

    return run_recipe(settings)


def register(subparsers: argparse._SubParsersAction) -> None:
    register_recipe_command(
        subparsers,
        name="sft",
        help="supervised fine-tuning on demonstrations (LoRA, TRL): the cold start before RL",
        description=DESCRIPTION,
        settings_class=SFTSettings,
        run_recipe=run_sft,
    )
