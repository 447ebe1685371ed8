"""``posttrain primitives-demo``: GRPO on an environment over the primitives service."""

from __future__ import annotations

import argparse

from posttrain.commands.dataclass_args import add_dataclass_args, settings_from_args
from posttrain.service.demo import DemoSettings, run_demo

DESCRIPTION = """\
GRPO on an environment (--env, the refund rule by default) driven entirely through the
training-primitives service
(posttrain serve): this process owns prompts, rewards, advantages and the loss payload;
the server owns the model, sampling and ordered execution. Starts a server in-process
(or uses --url), runs the ordered loop (save_weights_for_sampler N -> sample N -> score
-> forward_backward -> optim_step) for --cycles cycles with a logprob-parity check each
cycle, then samples the holdout from version 0 and from the final version with the same
seeds and prints pass@1 before and after with intervals and the paired delta."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "primitives-demo",
        help="GRPO on an environment through the primitives service, pass@1 before/after",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataclass_args(parser, DemoSettings)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_demo(settings_from_args(DemoSettings, args))
    return 0
