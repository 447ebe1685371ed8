"""Flags that choose what answers the prompts: the scripted agent or a model.

Shared by ``posttrain eval`` and anything else that evaluates a policy.
"""

from __future__ import annotations

import argparse
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.agents import Behaviour, SeededAgentConfig, seeded_agent

BEHAVIOUR_KEYS = ("right", "invent", "refund_first", "malformed")


def parse_behaviour(text: str) -> tuple[str, Behaviour]:
    """Parse ``CATEGORY=key:p[,key:p...]``, e.g. ``with_id=right:0.3,refund_first:0.3``."""
    category, _, spec = text.partition("=")
    if category not in ("with_id", "no_id", "off_topic") or not spec:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected CATEGORY=key:p[,key:p], CATEGORY one of with_id, no_id, off_topic"
        )
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, _, number = part.partition(":")
        if key not in BEHAVIOUR_KEYS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: unknown behaviour {key!r}; use {', '.join(BEHAVIOUR_KEYS)}"
            )
        try:
            values[key] = float(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {number!r} is not a number") from None
    values.setdefault("right", 0.0)
    try:
        return category, Behaviour(**values)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None


def add_agent_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what answers the prompts")
    group.add_argument(
        "--agent",
        choices=("seeded", "model"),
        default=None,
        help="'seeded': the scripted agent (no model); 'model': a language model "
        "(implied by --base-model). Default: seeded unless --base-model is given",
    )
    defaults = SeededAgentConfig()
    group.add_argument(
        "--behaviour",
        action="append",
        type=parse_behaviour,
        default=[],
        metavar="CATEGORY=key:p,...",
        help="scripted agent behaviour per category; keys right, invent, refund_first, "
        "malformed (probabilities; the rest is plain prose). Defaults: "
        f"with_id right:{defaults.with_id.right},refund_first:{defaults.with_id.refund_first}; "
        f"no_id right:{defaults.no_id.right},invent:{defaults.no_id.invent}; "
        f"off_topic right:{defaults.off_topic.right}. Repeatable",
    )
    group.add_argument(
        "--agent-seed", type=int, default=0, help="the scripted agent's seed (default 0)"
    )
    group.add_argument(
        "--base-model",
        default=None,
        help="model to evaluate: starter, starter-2m, smollm2, a hub id, a local folder "
        "or a .gguf file",
    )
    group.add_argument("--adapter", default=None, help="LoRA adapter folder or run folder")
    group.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)"
    )
    group.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (default 0.95)")
    group.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="reply length cap in tokens (default: the model's evaluation default)",
    )


def build_agent(args: argparse.Namespace) -> Any:
    """The agent the flags describe. A model is loaded only when asked for."""
    kind = args.agent or ("model" if args.base_model else "seeded")
    if kind == "seeded":
        if args.base_model or args.adapter:
            raise PosttrainError("--base-model/--adapter need --agent model (or no --agent)")
        overrides = dict(args.behaviour)
        return seeded_agent(SeededAgentConfig(**overrides), seed=args.agent_seed)
    if not args.base_model:
        raise PosttrainError("--agent model needs --base-model (e.g. --base-model starter)")
    from posttrain.policy.model_agent import agent_for_model

    return agent_for_model(
        args.base_model,
        adapter=args.adapter,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
    )
