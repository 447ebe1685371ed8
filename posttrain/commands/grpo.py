"""``posttrain grpo``: the GRPO recipe end to end (the project's main job)."""

from __future__ import annotations

import argparse

from posttrain.commands.dataclass_args import add_dataclass_args, settings_from_args
from posttrain.train.grpo import GRPOSettings, run_grpo
from posttrain.train.settings import RecipeSettings

DESCRIPTION = """\
GRPO on one testable rule, end to end: write the prompts (or read --prompts-file),
hold out 20% of scenarios, evaluate the base policy on the holdout (--eval-repeats
times, for the noise band), train a LoRA adapter with TRL's GRPOTrainer against the
environment's rule reward, evaluate again on the same holdout, and print the paired
delta with its interval and verdict, the guard check and the table by category.
Everything lands in <runs>/<run-name>/ (config.json, summary.json, holdout rows,
adapter/, report.md, curves.png). Exit status: 0 done, 1 a guard fell, 130 Ctrl-C."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "grpo",
        help="train with GRPO (LoRA, TRL) and report before/after with intervals",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    own = tuple(
        name
        for name in GRPOSettings.__dataclass_fields__
        if name not in RecipeSettings.__dataclass_fields__ or name == "run_name"
    )
    add_dataclass_args(parser.add_argument_group("GRPO"), GRPOSettings, only=own)
    add_dataclass_args(
        parser.add_argument_group("model, data, evaluation and run"), GRPOSettings, skip=own
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    summary = run_grpo(settings_from_args(GRPOSettings, args))
    if summary["status"] == "stopped" and summary.get("stop_reason") == "Ctrl-C":
        return 130
    return 0 if summary.get("ok", True) else 1
