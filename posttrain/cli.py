"""The ``posttrain`` command: one entry point, one module per subcommand.

Each module in ``posttrain.commands`` exposes ``register(subparsers)``, which
adds its parser and sets ``func`` to the function that runs it. Adding a
subcommand is one new module plus one line in ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from posttrain.commands.env_flag import fold_env_args
from posttrain.errors import PosttrainError

# subcommand modules, in the order `posttrain --help` lists them
COMMAND_MODULES = (
    "posttrain.commands.eval",
    "posttrain.commands.prompts",
    "posttrain.commands.sft",
    "posttrain.commands.grpo",
    "posttrain.commands.dpo",
    "posttrain.commands.pairs",
    "posttrain.commands.ui",
    "posttrain.commands.runs",
    "posttrain.commands.model",
    "posttrain.commands.serve",
    "posttrain.commands.primitives_demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="Turn one testable rule into a trained, measured agent.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        fold_env_args(args)
        return int(args.func(args) or 0)
    except PosttrainError as error:
        print(f"posttrain {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"posttrain {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
