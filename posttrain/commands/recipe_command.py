"""What ``posttrain grpo`` and ``posttrain dpo`` share: their parser layout and exit codes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from posttrain.commands.cpu_flag import set_up_cpu_for
from posttrain.commands.dataclass_args import add_dataclass_args, settings_from_args
from posttrain.commands.env_flag import add_env_arg, env_pairs
from posttrain.commands.settings_file import load_settings_file
from posttrain.envs.ecosystem import with_env_args
from posttrain.interrupts import SIGTERM_EXIT_CODE, interruptible
from posttrain.train.distributed import current_ranks
from posttrain.train.settings import RecipeSettings, check_before_loading


def register_recipe_command(
    subparsers: argparse._SubParsersAction,
    *,
    name: str,
    help: str,
    description: str,
    settings_class: type,
    run_recipe: Callable[[Any], dict[str, Any]],
) -> None:
    """Add ``posttrain NAME``: the recipe's own flags first, then the shared ones.

    Flags come from the settings dataclass's field metadata, so ``--help``, the
    parser and ``config.json`` cannot drift apart.
    """
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    own = tuple(
        field
        for field in settings_class.__dataclass_fields__
        if field not in RecipeSettings.__dataclass_fields__ or field == "run_name"
    )
    add_dataclass_args(parser.add_argument_group(name.upper()), settings_class, only=own)
    add_dataclass_args(
        parser.add_argument_group("model, data, evaluation and run"), settings_class, skip=own
    )
    add_env_arg(parser)
    parser.add_argument(
        "--config", metavar="FILE", default=None,
        help="read flags from a TOML, YAML or JSON file (keys are flag names; a run's own "
        "config.json re-runs it); flags on the command line win over the file",
    )

    def run(args: argparse.Namespace) -> int:
        settings = settings_for(settings_class, args, name)
        # refused before the trainer's libraries load (seconds), not after
        check_before_loading(settings, current_ranks().world)
        # the model --config named may not be the flags': the numerics follow the settings
        args.cpu_setup = set_up_cpu_for(getattr(args, "numerics", None), settings.base_model,
                                        from_run=settings.from_run, runs_dir=settings.runs_dir,
                                        previous=getattr(args, "cpu_setup", None))
        with interruptible():
            summary = run_recipe(settings)
        return recipe_exit_code(summary)

    parser.set_defaults(func=run)


def settings_for(settings_class: type, args: argparse.Namespace, command: str) -> Any:
    """The recipe's settings: command-line flags, then ``--config FILE``, then defaults."""
    file_values = (load_settings_file(args.config, settings_class, command)
                   if getattr(args, "config", None) else {})
    settings = settings_from_args(settings_class, args, file_values)
    pairs = env_pairs(args)
    if pairs:  # --env came from the file or the default: fold the pairs in now
        settings.env = with_env_args(settings.env, pairs)
    return settings


def recipe_exit_code(summary: dict[str, Any]) -> int:
    """0 done, 1 a guard fell, 130 stopped by Ctrl-C, 143 by SIGTERM (a stop on an alarm
    is 0)."""
    if summary["status"] == "stopped" and summary.get("stop_reason") == "Ctrl-C":
        return 130
    if summary["status"] == "stopped" and summary.get("stop_reason") == "SIGTERM":
        return SIGTERM_EXIT_CODE
    return 0 if summary.get("ok", True) else 1
