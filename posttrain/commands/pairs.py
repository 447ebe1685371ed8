"""``posttrain pairs build|stats``: preference pairs for DPO as a file of their own.

``build`` samples a policy (or the scripted agent) on the train split of a prompt
set, scores every reply with the environment and writes the pairs JSONL that
``posttrain dpo --pairs`` reads; ``stats`` describes such a file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from posttrain.atomic import check_output_path
from posttrain.commands.agent_args import add_agent_args, build_agent
from posttrain.commands.dataclass_args import (
    add_dataclass_args,
    real_number,
    settings_from_args,
    whole_in,
    whole_number,
)
from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prepare import DataFlags, prepare_data
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import require_single_turn
from posttrain.errors import PosttrainError
from posttrain.progress import progress_bar
from posttrain.train.training_data.pairs import (
    DEFAULT_CONSTRUCTED_SHARE,
    DEFAULT_MAX_PAIRS_PER_PROMPT,
    DEFAULT_MIN_MARGIN,
    build_preference_pairs,
    export_preference,
    load_pairs,
    sample_pair_rows,
    summarize_pairs,
    user_text,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pairs",
        help="build preference pairs from a policy's samples, or describe a pairs file",
        description="Build DPO preference pairs (JSONL, TRL conversational rows plus margin, "
        "scenario_id and constructed) or describe a pairs file.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    build = actions.add_parser(
        "build",
        help="sample the train prompts, pair better with worse replies, write JSONL",
        description="Sample --pair-samples replies per train prompt from an agent (the scripted "
        "one by default, a model with --base-model), score them with the environment, pair "
        "a better reply with a worse one of similar length, and write the pairs. The "
        "holdout is left out, so a DPO run on the file is still measured on unseen prompts.",
    )
    build.add_argument("--out", required=True, metavar="FILE", help="the pairs JSONL to write")
    data = build.add_argument_group("prompts (the same flags and split as posttrain dpo)")
    add_dataclass_args(data, DataFlags)
    data.add_argument(
        "--seed", type=whole_number, default=0,
        help="sampling seed of the policy's replies (default 0)"
    )
    data.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"environment name, module:attribute, verifiers:ENV_ID or inspect:PKG/TASK "
             f"(default {DEFAULT_ENV})",
    )
    add_env_arg(data)
    add_agent_args(build)
    pairing = build.add_argument_group("pairing")
    pairing.add_argument(
        "--pair-samples", type=whole_in(high=1024), default=8,
        help="replies per train prompt (default 8)"
    )
    pairing.add_argument(
        "--min-margin",
        type=real_number,
        default=DEFAULT_MIN_MARGIN,
        help=f"least raw-score gap of a pair (default {DEFAULT_MIN_MARGIN})",
    )
    pairing.add_argument(
        "--max-pairs-per-prompt",
        type=whole_in(high=10_000),
        default=DEFAULT_MAX_PAIRS_PER_PROMPT,
        help=f"pairs one prompt may give (default {DEFAULT_MAX_PAIRS_PER_PROMPT})",
    )
    pairing.add_argument(
        "--constructed-negatives",
        action="store_true",
        help="add (own passing reply, the environment's known-bad reply) pairs where it knows "
        "one (refund: an invented lookup on prompts without an id)",
    )
    pairing.add_argument(
        "--constructed-share",
        type=real_number,
        default=DEFAULT_CONSTRUCTED_SHARE,
        help="cap on constructed pairs, as a share of the sampled ones "
        f"(default {DEFAULT_CONSTRUCTED_SHARE})",
    )
    build.add_argument("--json", action="store_true", help="print the pair report as JSON")
    build.set_defaults(func=run_build)

    stats = actions.add_parser(
        "stats",
        help="describe a pairs file: counts, margins, length balance, categories",
        description="Describe a pairs JSONL: pairs, constructed pairs, mean margin, how often "
        "the chosen side is longer (with the length-confound warning), pairs per category.",
    )
    stats.add_argument("file", help="a pairs JSONL")
    stats.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"environment name, module:attribute, verifiers:ENV_ID or inspect:PKG/TASK "
             f"(default {DEFAULT_ENV})",
    )
    add_env_arg(stats)
    stats.add_argument("--skip-invalid", action="store_true", help="drop bad lines and count them")
    stats.add_argument("--json", action="store_true", help="print the report as JSON")
    stats.set_defaults(func=run_stats)


def run_build(args: argparse.Namespace) -> int:
    if args.pair_samples < 2:
        raise PosttrainError(f"--pair-samples must be at least 2, got {args.pair_samples}")
    if args.min_margin <= 0:
        raise PosttrainError(f"--min-margin must be above 0, got {args.min_margin}")
    if args.max_pairs_per_prompt < 1:
        raise PosttrainError("--max-pairs-per-prompt must be at least 1")
    if args.constructed_share < 0:
        raise PosttrainError(f"--constructed-share must be >= 0, got {args.constructed_share}")
    check_output_path(args.out, what="--out", not_same_as=[args.prompts_file])
    env = get_env(args.env)
    require_single_turn(env, "posttrain pairs")
    data = prepare_data(settings_from_args(DataFlags, args).data_config(), env)
    print(data.describe(tuple(env.categories)), file=sys.stderr)
    agent = build_agent(args, env)
    total = args.pair_samples * len(data.train)
    with progress_bar("pairs: sampling", total) as update:
        rows = sample_pair_rows(
            env,
            data.train,
            agent,
            args.pair_samples,
            seed=args.seed,
            progress=lambda done, _total: update(done),
        )
    pairs, report = build_preference_pairs(
        rows,
        env=env,
        min_margin=args.min_margin,
        max_pairs_per_prompt=args.max_pairs_per_prompt,
        constructed_share=args.constructed_share if args.constructed_negatives else None,
    )
    if not pairs:
        raise PosttrainError(
            f"no pairs: no train prompt had contrast in {args.pair_samples} samples; raise "
            f"--pair-samples (e.g. {args.pair_samples * 2}); nothing written"
        )
    export_preference(pairs, args.out)
    if args.json:
        print(json.dumps({**report.to_dict(), "path": args.out}, sort_keys=True))
    else:
        print(report.describe())
        print(f"wrote {len(pairs)} pairs to {args.out}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    env = get_env(args.env)
    require_single_turn(env, "posttrain pairs")
    pairs, skipped = load_pairs(args.file, skip_invalid=args.skip_invalid)
    report = summarize_pairs(pairs, source=args.file)
    report.skipped_lines = len(skipped)
    by_category = Counter(
        (env.category(env.case_for(user_text(pair))), bool(pair["constructed"])) for pair in pairs
    )
    systems = {
        pair["prompt"][0]["content"] for pair in pairs if pair["prompt"][0]["role"] == "system"
    }
    other_system = sum(1 for text in systems if text != env.system)
    if other_system:
        report.warnings.append(
            f"{other_system} system prompt(s) differ from the {env.name} environment's: "
            "the policy is evaluated under the environment's"
        )
    if args.json:
        categories = [
            {"category": name, "constructed": constructed, "pairs": count}
            for (name, constructed), count in sorted(by_category.items())
        ]
        print(json.dumps({**report.to_dict(), "by_category": categories}, sort_keys=True))
        return 0
    print(report.describe())
    for problem in skipped:
        print(f"skipped {problem}")
    print(f"{'category':<12}{'sampled':>9}{'constructed':>13}")
    for name in env.categories:
        print(f"{name:<12}{by_category[(name, False)]:>9}{by_category[(name, True)]:>13}")
    return 0
