"""``--env-arg KEY=VALUE``: the loader arguments of an environment another library loads,
and ``--env-judge-endpoint URL`` (with ``--env-judge-model``, ``--env-judge-key-env``):
the judge model that environment's own judge calls.

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
    """Add ``--env-arg`` and ``--env-judge-*`` to ``parser`` (a parser or an argument
    group)."""
    parser.add_argument("--env-arg", action="append", default=None, metavar="KEY=VALUE",
                        help=ENV_ARG_HELP)
    parser.add_argument(
        "--env-judge-endpoint", default=None, metavar="URL",
        help="an OpenAI-compatible API for the environment's own judge (a verifiers "
             "JudgeRubric or v1 judge), which posttrain otherwise refuses to run; not "
             "posttrain's --judge-endpoint, which judges beside the rule")
    parser.add_argument("--env-judge-model", default=None, metavar="NAME",
                        help="with --env-judge-endpoint: the judge model (default: the one "
                             "the environment names)")
    parser.add_argument("--env-judge-key-env", default=None, metavar="VAR",
                        help="with --env-judge-endpoint: the environment variable holding "
                             "the judge's API key (default OPENAI_API_KEY; the key itself is "
                             "never written into a run)")


#: the --env-judge-* flags (their argparse names) and the spec keys they become
_JUDGE_FLAGS = (("env_judge_endpoint", "posttrain.judge_endpoint"),
                ("env_judge_model", "posttrain.judge_model"),
                ("env_judge_key_env", "posttrain.judge_key_env"))


def env_pairs(args: argparse.Namespace) -> list[str]:
    """The ``KEY=VALUE`` pairs ``--env-arg`` and ``--env-judge-*`` add to the spec."""
    pairs = list(getattr(args, "env_arg", None) or [])
    for flag, key in _JUDGE_FLAGS:
        value = getattr(args, flag, None)
        if value is not None:
            pairs.append(f"{key}={value}")
    return pairs


def fold_env_args(args: argparse.Namespace) -> None:
    """Write ``--env-arg`` / ``--env-judge-*`` pairs into ``args.env`` (a no-op without
    them, or while ``args.env`` is still unresolved: a recipe folds them after its
    settings file, ``recipe_command.settings_for``)."""
    pairs = env_pairs(args)
    env = getattr(args, "env", None)
    if pairs and env is None:
        raise PosttrainError("--env-arg and --env-judge-* need --env (verifiers:ENV_ID or "
                             "inspect:PKG/TASK) to pass them to")
    if pairs and isinstance(env, str):
        args.env = with_env_args(env, pairs)
        args.env_arg = None
        for flag, _ in _JUDGE_FLAGS:
            setattr(args, flag, None)
