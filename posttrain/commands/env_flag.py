"""``--env-arg KEY=VALUE``: the loader arguments of an environment another library loads.

Every command that takes ``--env`` takes it. The pairs are folded into the environment's
spec (``verifiers:vf-arith?count=40``,
``inspect:inspect_arith/arith?count=80``, ``posttrain.envs.ecosystem.spec``), so the one
string a run records names the same environment again.
"""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.envs.ecosystem import with_env_args
from posttrain.errors import PosttrainError

ENV_ARG_HELP = (
    "KEY=VALUE for the loader of --env verifiers:ENV_ID (its load_environment's keyword "
    "arguments) or --env inspect:PKG/TASK (the task function's arguments); repeatable. "
    "A VALUE that reads as JSON is passed as such (count=40 is a number, ops='[\"+\"]' a "
    "list), any other as text")


def add_env_arg(parser: Any) -> None:
    """Add ``--env-arg`` to ``parser`` (a parser or an argument group)."""
    parser.add_argument("--env-arg", action="append", default=None, metavar="KEY=VALUE",
                        help=ENV_ARG_HELP)


def fold_env_args(args: argparse.Namespace) -> None:
    """Write ``--env-arg`` pairs into ``args.env`` (a no-op without them, or while
    ``args.env`` is still unresolved: a recipe folds them after its settings file)."""
    pairs = getattr(args, "env_arg", None)
    env = getattr(args, "env", None)
    if pairs and env is None:
        raise PosttrainError("--env-arg needs --env (verifiers:ENV_ID or inspect:PKG/TASK) "
                             "to pass its arguments to")
    if pairs and isinstance(env, str):
        args.env = with_env_args(env, pairs)
        args.env_arg = None
