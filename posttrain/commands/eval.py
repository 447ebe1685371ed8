"""``posttrain eval``: pass@1 of an agent with intervals, overall and by category.

Also ``posttrain eval --compare BEFORE AFTER``: the paired delta of two evaluations of
the same prompts, with the category table and the guard check: posttrain's graded row
files, or two inspect_ai logs, or two lm-eval ``--log_samples`` outputs
(``score.eval_logs``).
"""

from __future__ import annotations

import argparse
import json
import sys

from posttrain.agents import agent_identity
from posttrain.atomic import check_output_path
from posttrain.commands.agent_args import add_agent_args, build_agent
from posttrain.commands.dataclass_args import (
    add_dataclass_args,
    settings_from_args,
    whole_in,
    whole_number,
)
from posttrain.commands.env_flag import add_env_arg
from posttrain.data.prepare import DataFlags, prepare_data
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.errors import PosttrainError
from posttrain.policy.judge import agreement, endpoint_judge
from posttrain.progress import progress_bar
from posttrain.score.delta import noise_band, run_verdict
from posttrain.score.episode_stats import episode_stats, format_episode_stats
from posttrain.score.eval_logs import POSTTRAIN_ROWS, load_compared, pairing_problem
from posttrain.score.evaluate import evaluate
from posttrain.score.passat import category_table, format_group_table, pass_at
from posttrain.score.rows import save_rows


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
        help=f"environment name, module:attribute, verifiers:ENV_ID or inspect:PKG/TASK "
             f"(default {DEFAULT_ENV})",
    )
    add_env_arg(data)
    add_agent_args(parser)
    sampling = parser.add_argument_group("evaluation")
    sampling.add_argument(
        "--samples", type=whole_in(high=1024), default=4, help="samples per prompt, k (default 4)"
    )
    sampling.add_argument(
        "--eval-seed", type=whole_number, default=0,
        help="sampling seed of the evaluation (default 0)"
    )
    sampling.add_argument(
        "--repeats",
        type=whole_in(high=100),
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
        help="print the paired delta of two evaluations and exit: posttrain's graded row "
             "files, inspect_ai logs (.eval/.json) or lm-eval --log_samples output "
             "(samples_*.jsonl or its folder)",
    )
    output.add_argument(
        "--noise-from",
        nargs="+",
        default=None,
        metavar="ROWS",
        help="with --compare: two or more evaluations (row files or logs) of one policy "
             "re-evaluated, for the noise band",
    )
    output.add_argument(
        "--score", default=None, metavar="NAME",
        help="with --compare on evaluations run elsewhere: the inspect_ai scorer, or the "
             "lm-eval METRIC[,FILTER] (e.g. exact_match,strict-match), that decides a pass "
             "(default: the first the log records)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return run_compare(args)
    if args.samples < 1:
        raise PosttrainError(f"--samples must be at least 1, got {args.samples}")
    if args.out:
        check_output_path(args.out, what="--out", not_same_as=[args.prompts_file])
    env = get_env(args.env)
    data = prepare_data(settings_from_args(DataFlags, args).data_config(), env,
                        need_holdout=args.split == "holdout")
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
    clustered = "n/a" if overall.se_clustered is None else f"{overall.se_clustered:.3f}"
    print(f"{args.split} {overall}  clustered SE {clustered}")
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
    """The paired verdict of two evaluations: posttrain's graded rows, inspect_ai logs or
    lm-eval samples (``score.eval_logs``), each side paired by scenario / sample id."""
    before = load_compared(args.compare[0], args.score)
    after = load_compared(args.compare[1], args.score)
    problem = pairing_problem(before, after)
    if problem:
        raise PosttrainError(f"--compare {args.compare[0]} {args.compare[1]}: cannot pair: "
                             f"{problem}")
    noise = None
    if args.noise_from:
        if len(args.noise_from) < 2:
            raise PosttrainError("--noise-from needs two or more row files of the same policy")
        noise = noise_band([load_compared(path, args.score).rows for path in args.noise_from])
    foreign = before.kind != POSTTRAIN_ROWS
    # a foreign log records no well_formed marker: only posttrain's rows have guards
    report = run_verdict(before.rows, after.rows, noise=noise,
                         guards=() if foreign else None)
    notes = list(dict.fromkeys([*before.notes, *after.notes]))
    if args.json:
        summary = report.to_dict()
        if foreign:
            summary["sources"] = {"before": before.describe(), "after": after.describe()}
            summary["notes"] = notes
        print(json.dumps(summary, sort_keys=True))
    else:
        if foreign:
            print(f"before: {before.describe()}\nafter:  {after.describe()}")
            for note in notes:
                print(f"note: {note}")
        print(report.format())
    return 0 if report.ok else 1
