"""``posttrain prompts write|stats|split|filter``: build and inspect prompt sets."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from posttrain.atomic import check_output_path
from posttrain.commands.agent_args import add_endpoint_args, endpoint_settings
from posttrain.commands.dataclass_args import real_number, whole_in, whole_number
from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prepare import DEFAULT_SITUATIONS
from posttrain.data.prompts import (
    drop_near_duplicates,
    keep_category,
    load_prompts,
    save_prompts,
    split_holdout,
    split_holdout_stratified,
    summary,
)
from posttrain.data.writer import ANGLES, DEFAULT_ANGLES, WriterSettings, write_with_model
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import Env, PromptWriter, require_hook
from posttrain.errors import PosttrainError
from posttrain.policy.endpoint_agent import EndpointAgent
from posttrain.policy.loading import agent_for_model


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prompts",
        help="write, inspect, split and filter prompt sets (JSONL)",
        description="Write, inspect, split and filter prompt sets (JSONL, one record a line).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    write = actions.add_parser(
        "write", help="write a prompt set: templates, or rewritten by a chat model",
        description=(
            "Write a prompt set. Alone: the environment's template prompts. With --writer "
            "MODEL or --endpoint URL: a chat model rewrites every template prompt from several "
            "angles; a version is kept only when the environment reads the same category and "
            "ground truth from it as from its seed (a with-id seed keeps its exact id) and it "
            "is no near duplicate of a prompt kept before it. The seeds come first in the file. "
            "Interrupted, the same command continues (a journal sits next to the output "
            "until it is written)."),
    )
    write.add_argument("out", help="output JSONL file")
    write.add_argument(
        "--prompts",
        type=whole_in(high=10_000_000),
        default=DEFAULT_SITUATIONS,
        help="template situations to write (default %(default)s)",
    )
    write.add_argument(
        "--data-seed",
        "--seed",
        dest="seed",
        type=whole_number,
        default=0,
        help="simulator seed (a recipe's --data-seed); same seed, same bytes (default 0)",
    )
    _add_env(write)
    writer = write.add_argument_group("a model that rewrites the templates")
    writer.add_argument(
        "--writer", default=None, metavar="MODEL",
        help="a chat model loaded here: smollm2, a hub id, a local folder or a .gguf file")
    writer.add_argument(
        "--angles", default=",".join(DEFAULT_ANGLES),
        help=f"comma-separated angles to write from (default %(default)s; all: "
        f"{', '.join(ANGLES)})")
    writer.add_argument(
        "--per-request", type=whole_in(high=100), default=3,
        help="versions asked for per seed and angle (default 3)")
    writer.add_argument(
        "--jaccard", type=real_number, default=0.8,
        help="near-duplicate threshold: word-set Jaccard at or above it drops a version "
        "(default 0.8)")
    writer.add_argument(
        "--temperature", type=real_number, default=0.9,
        help="the writer's temperature (default 0.9)")
    writer.add_argument(
        "--max-new-tokens", type=whole_in(high=1_000_000), default=384,
        help="the writer's reply cap in tokens (default 384)")
    add_endpoint_args(write, "the model behind it rewrites the templates (instead of --writer)")
    write.set_defaults(func=run_write)

    stats = actions.add_parser(
        "stats", help="count prompts, scenarios and categories", description="Count a prompt set."
    )
    stats.add_argument("file", help="JSONL prompt file")
    stats.add_argument("--json", action="store_true", help="print the counts as JSON")
    _add_env(stats)
    stats.set_defaults(func=run_stats)

    split = actions.add_parser(
        "split",
        help="split into train and holdout by scenario",
        description="Split a prompt set into train and holdout files by scenario id.",
    )
    split.add_argument("file", help="JSONL prompt file")
    split.add_argument("--holdout", type=real_number, default=0.2,
                       help="share of scenarios held out")
    split.add_argument(
        "--stratified",
        action="store_true",
        help="split within each category so every category is in the holdout",
    )
    split.add_argument("--train-out", required=True, help="train JSONL to write")
    split.add_argument("--holdout-out", required=True, help="holdout JSONL to write")
    _add_env(split)
    split.set_defaults(func=run_split)

    filter_ = actions.add_parser(
        "filter",
        help="drop near duplicates and prompts outside their seed's category",
        description=(
            "Filter a model-written set: drop prompts whose category differs from the "
            "category of their seed prompt (the 'seed' field), then near duplicates "
            "(word-set Jaccard at or above --jaccard against an earlier kept prompt)."
        ),
    )
    filter_.add_argument("file", help="JSONL prompt file")
    filter_.add_argument("out", help="filtered JSONL to write")
    filter_.add_argument(
        "--jaccard", type=real_number, default=0.8, help="near-duplicate threshold (default 0.8)"
    )
    _add_env(filter_)
    filter_.set_defaults(func=run_filter)


def _add_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"environment (a name, module:attribute, verifiers:ENV_ID or inspect:PKG/TASK): "
             f"reads each prompt's category and ground truth (default {DEFAULT_ENV})",
    )
    add_env_arg(parser)


def _print_counts(counts: dict[str, int], env: Env, label: str = "") -> None:
    named = [name for name in env.categories if name in counts]
    others = sorted(set(counts) - {"prompts", "scenarios", *named})
    categories = ", ".join(f"{name} {counts[name]}" for name in [*named, *others])
    print(f"{label}{counts['prompts']} prompts, {counts['scenarios']} scenarios ({categories})")


def run_write(args: argparse.Namespace) -> int:
    if args.prompts < 1:
        raise PosttrainError(f"--prompts must be at least 1, got {args.prompts}")
    check_output_path(args.out)
    env = get_env(args.env)
    write_prompts = require_hook(
        env, PromptWriter, "writes no prompts",
        'write them yourself as JSONL, one {"prompt": ..., "scenario_id": ...} a line',
    ).write_prompts
    if args.writer and args.endpoint:
        raise PosttrainError("--writer and --endpoint both name a writer: give one")
    settings = None
    if args.writer or args.endpoint:  # checked before any model loads
        settings = WriterSettings(
            angles=tuple(part.strip() for part in args.angles.split(",") if part.strip()),
            per_request=args.per_request, jaccard=args.jaccard, seed=args.seed)
        if not 0 < args.temperature <= 2:
            raise PosttrainError(f"--temperature must be in (0, 2], got {args.temperature}")
        if args.max_new_tokens < 16:
            raise PosttrainError(f"--max-new-tokens must be at least 16, got "
                                 f"{args.max_new_tokens}")
    records = write_prompts(args.prompts, seed=args.seed)
    if settings is None:
        save_prompts(args.out, records)
        _print_counts(summary(records), env, label=f"wrote {args.out}: ")
        return 0
    agent = writer_agent(args)
    kept, report = write_with_model(env, records, agent, Path(args.out), settings,
                                    label=f"writing with {args.writer or args.endpoint}")
    print(report.describe())
    _print_counts(summary(kept), env, label=f"wrote {args.out}: ")
    return 0


def writer_agent(args: argparse.Namespace) -> Any:
    """The model that rewrites: one loaded here (``--writer``) or behind ``--endpoint``."""
    if args.endpoint:
        return EndpointAgent(endpoint_settings(args, temperature=args.temperature, top_p=0.95,
                                               max_tokens=args.max_new_tokens))
    return agent_for_model(args.writer, temperature=args.temperature, top_p=0.95,
                           max_new_tokens=args.max_new_tokens)


def run_stats(args: argparse.Namespace) -> int:
    env = get_env(args.env)
    counts = summary(load_prompts(args.file, env=env))
    if args.json:
        print(json.dumps(counts, sort_keys=True))
    else:
        _print_counts(counts, env, label=f"{args.file}: ")
    return 0


def run_split(args: argparse.Namespace) -> int:
    check_output_path(args.train_out, what="--train-out", not_same_as=[args.file])
    check_output_path(args.holdout_out, what="--holdout-out", not_same_as=[args.file])
    if os.path.realpath(args.train_out) == os.path.realpath(args.holdout_out):
        raise PosttrainError("--train-out and --holdout-out name the same file: give two")
    env = get_env(args.env)
    records = load_prompts(args.file, env=env)
    splitter = split_holdout_stratified if args.stratified else split_holdout
    train, holdout = splitter(records, args.holdout)
    save_prompts(args.train_out, train)
    save_prompts(args.holdout_out, holdout)
    _print_counts(summary(train), env, label=f"train   {args.train_out}: ")
    _print_counts(summary(holdout), env, label=f"holdout {args.holdout_out}: ")
    return 0


def run_filter(args: argparse.Namespace) -> int:
    check_output_path(args.out, not_same_as=[args.file])
    env = get_env(args.env)
    records = load_prompts(args.file, env=env)
    wanted: dict[str, str] = {}
    for record in records:  # a scenario's category is its first seed prompt's
        if record.get("seed"):
            wanted.setdefault(
                str(record["scenario_id"]), env.category(env.case_for(record["seed"]))
            )
    in_category, off_category = keep_category(records, wanted)
    kept, near = drop_near_duplicates(in_category, args.jaccard)
    save_prompts(args.out, kept)
    print(
        f"kept {len(kept)} of {len(records)}: dropped {off_category} outside their seed's "
        f"category, {near} near duplicates (Jaccard >= {args.jaccard})"
    )
    return 0
