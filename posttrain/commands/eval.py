"""``posttrain eval``: pass@1 of an agent with intervals, overall and by category.

Also ``posttrain eval --compare BEFORE AFTER``: the paired delta of two graded
row files (same prompts), with the category table and the guard check.
"""

from __future__ import annotations

import argparse
import json
import sys

from posttrain.agents import agent_identity
from posttrain.commands.agent_args import add_agent_args, build_agent
from posttrain.commands.dataclass_args import add_dataclass_args, settings_from_args
from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prepare import DataFlags, prepare_data
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.errors import PosttrainError
from posttrain.policy.judge import agreement, endpoint_judge
from posttrain.progress import progress_bar
from posttrain.score.delta import noise_band, run_verdict
from posttrain.score.episode_stats import episode_stats, format_episode_stats
from posttrain.score.evaluate import evaluate
from posttrain.score.passat import category_table, format_group_table, pass_at
from posttrain.score.rows import load_rows, save_rows


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate an agent (pass@1 with intervals, by category) or compare two row files",
        description=(
            "Evaluate an agent on a prompt set: k seeded samples per prompt, pass@1 with a "
            "95% bootstrap interval over scenarios, and the table by category. With "
            "--compare, print the paired delta between two graded row files instead."
        ),
    )
    data = parser.add_argument_group("prompts (the same flags and split as the recipes)")
    # --seed: this command's older name for the data seed
    add_dataclass_args(data, DataFlags, skip=("balance",), aliases={"data_seed": ("--seed",)})
    data.add_argument(
        "--split",
        choices=("holdout", "train", "all"),
        default="holdout",
        help="which prompts to evaluate (default holdout: the ones recipes report on)",
    )
    data.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"environment name, module:attribute or verifiers:ENV_ID (default {DEFAULT_ENV})",
    )
    add_env_arg(data)
    add_agent_args(parser)
    sampling = parser.add_argument_group("evaluation")
    sampling.add_argument(
        "--samples", type=int, default=4, help="samples per prompt, k (default 4)"
    )
    sampling.add_argument(
        "--eval-seed", type=int, default=0, help="sampling seed of the evaluation (default 0)"
    )
    sampling.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="evaluate this many times with different sampling seeds and report the spread",
    )
    judging = parser.add_argument_group("a model judge beside the rule")
    judging.add_argument(
        "--judge-endpoint", default=None, metavar="URL",
        help="an OpenAI-compatible API whose model judges every reply PASS or FAIL against "
        "the environment's policy; prints the judge-vs-rule table (counts, agreement, "
        "Cohen's kappa) and stamps each row with the verdict")
    judging.add_argument("--judge-model", default=None, metavar="NAME",
                         help="the judge model (default: the endpoint's only model)")
    judging.add_argument("--judge-key-env", default="OPENAI_API_KEY", metavar="VAR",
                         help="environment variable holding the judge's API key")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=None, help="write the graded rows (run 0) as JSONL")
    output.add_argument("--json", action="store_true", help="print a JSON summary instead")
    output.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        default=None,
        help="print the paired delta of two graded row files and exit",
    )
    output.add_argument(
        "--noise-from",
        nargs="+",
        default=None,
        metavar="ROWS",
        help="with --compare: two or more row files of one policy re-evaluated, for the noise band",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return run_compare(args)
    if args.samples < 1:
        raise PosttrainError(f"--samples must be at least 1, got {args.samples}")
    env = get_env(args.env)
    data = prepare_data(settings_from_args(DataFlags, args).data_config(), env)
    prompts = {"holdout": data.holdout, "train": data.train, "all": data.train + data.holdout}[
        args.split
    ]
    agent = build_agent(args, env)
    judge = None
    if args.judge_endpoint:  # checked before the evaluation: a bad judge costs no sampling

        judge = endpoint_judge(args.judge_endpoint, args.judge_model, args.judge_key_env, env)
        if args.judge_model:
            judge.agent.check()
    print(data.describe(tuple(env.categories)), file=sys.stderr)
    evaluation = evaluate(
        env,
        prompts,
        agent,
        samples=args.samples,
        seed=args.eval_seed,
        repeats=args.repeats,
        label=f"evaluating {args.split}",
    )
    rows = evaluation.rows
    judged = judge_rows(judge, rows) if judge else None
    if args.out:
        save_rows(args.out, rows)
    overall = pass_at(rows, seed=args.eval_seed)
    repeats = [pass_at(run_rows, seed=args.eval_seed).pass_at_1 for run_rows in evaluation.runs]
    episodes = episode_stats(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "split": args.split,
                    "policy": agent_identity(agent),
                    "pass_at": overall.to_dict(),
                    "repeats_pass_at_1": repeats,
                    "seconds": round(evaluation.seconds, 3),
                    **({"episodes": episodes} if episodes else {}),
                    **({"judge": judged.to_dict()} if judged else {}),
                },
                sort_keys=True,
            )
        )
        return 0
    print(f"policy: {_describe_policy(agent_identity(agent))}")
    print(f"{args.split} {overall}  clustered SE {overall.se_clustered:.3f}")
    if len(repeats) > 1:
        print("repeats pass@1: " + ", ".join(f"{value:.3f}" for value in repeats))
    print(format_group_table(category_table(rows, seed=args.eval_seed)))
    if episodes:
        print(format_episode_stats(episodes))
    if judged:
        print(judged.format())
    if args.out:
        print(f"rows written to {args.out}")
    return 0


def judge_rows(judge, rows: list[dict]):
    """Ask the judge about every row, stamp its verdict (``judge``: true, false or null)
    on the row, and return the judge-vs-rule ``Agreement``."""
    verdicts: list = []
    with progress_bar("judging", len(rows)) as update:
        for start in range(0, len(rows), 32):
            verdicts += judge.verdicts(rows[start : start + 32])
            update(len(verdicts))
    for row, verdict in zip(rows, verdicts, strict=True):
        row["judge"] = verdict
    return agreement(rows, verdicts)


def _describe_policy(policy: dict) -> str:
    if policy.get("agent") == "seeded":
        return f"seeded agent (seed {policy.get('seed')})"
    return ", ".join(f"{key}={value}" for key, value in policy.items() if value is not None)


def run_compare(args: argparse.Namespace) -> int:
    before = load_rows(args.compare[0])
    after = load_rows(args.compare[1])
    noise = None
    if args.noise_from:
        if len(args.noise_from) < 2:
            raise PosttrainError("--noise-from needs two or more row files of the same policy")
        noise = noise_band([load_rows(path) for path in args.noise_from])
    report = run_verdict(before, after, noise=noise)
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report.format())
    return 0 if report.ok else 1
