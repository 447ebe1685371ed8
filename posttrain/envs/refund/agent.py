"""The refund environment's scripted agent: the ``scripted_agent`` hook.

A seeded agent for offline runs and tests, no model: per category it makes the
rule's right move, invents an order id, calls ``create_refund`` first, writes a
broken block, or replies in plain prose, with configurable probabilities. The
same seed and request seeds give the same replies on every run.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.agents import Messages, stable_seed
from posttrain.envs.refund.rule import case_for, category

#: the moves a ``Behaviour`` gives probabilities to (the rest: plain prose)
BEHAVIOUR_KEYS = ("right", "invent", "refund_first", "malformed")


@dataclass(frozen=True)
class Behaviour:
    """What the scripted agent does on one prompt category (probabilities sum to at most 1).

    ``right``: the rule's right move (lookup with the given id; ask for the id; short reply).
    ``invent``: a well-formed ``lookup_order`` call with a made-up id.
    ``refund_first``: a well-formed ``create_refund`` call.
    ``malformed``: a broken ``<tool_call>`` block.
    The rest of the probability mass is a plain reply that does not ask anything.
    """

    right: float = 1.0
    invent: float = 0.0
    refund_first: float = 0.0
    malformed: float = 0.0

    def __post_init__(self) -> None:
        parts = (self.right, self.invent, self.refund_first, self.malformed)
        if any(p < 0 for p in parts) or sum(parts) > 1.0 + 1e-9:
            raise ValueError(f"behaviour probabilities must be >= 0 and sum to <= 1, got {self}")


@dataclass(frozen=True)
class SeededAgentConfig:
    """Per-category behaviour of ``seeded_agent``; defaults mimic an untrained base policy."""

    with_id: Behaviour = field(default_factory=lambda: Behaviour(right=0.3, refund_first=0.3))
    no_id: Behaviour = field(default_factory=lambda: Behaviour(right=0.9, invent=0.1))
    off_topic: Behaviour = field(default_factory=lambda: Behaviour(right=0.95))


def _block(name: str, arguments: dict[str, Any]) -> str:
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{call}\n</tool_call>"


def _invented_id(prompt: str, rng: random.Random) -> str:
    while True:
        candidate = f"ORD-{rng.randrange(1000, 10000)}"
        if candidate.lower() not in prompt.lower():
            return candidate


def _right_reply(kind: str, order_id: str | None) -> str:
    if kind == "with_id":
        return _block("lookup_order", {"order_id": order_id})
    if kind == "no_id":
        return "I can help with that. What is the order id?"
    return "Sorry, I can only help with orders and refunds."


def _scripted_reply(prompt: str, config: SeededAgentConfig, rng: random.Random) -> str:
    case = case_for(prompt)
    kind = category(case)
    behaviour: Behaviour = getattr(config, kind)
    order_id = case["order_id"] or _invented_id(prompt, rng)
    draw = rng.random()
    for share, reply in (
        (behaviour.right, lambda: _right_reply(kind, case["order_id"])),
        (behaviour.invent, lambda: _block("lookup_order", {"order_id": _invented_id(prompt, rng)})),
        (
            behaviour.refund_first,
            lambda: _block("create_refund", {"order_id": order_id, "amount": 20}),
        ),
        (behaviour.malformed, lambda: '<tool_call>{"name": lookup_order</tool_call>'),
    ):
        if draw < share:
            return reply()
        draw -= share
    return "Thanks for reaching out. I have made a note of it."


class SeededAgent:
    """A scripted agent: deterministic for a (seed, prompt, request seed) triple."""

    def __init__(self, config: SeededAgentConfig, seed: int = 0):
        self.config = config
        self.seed = seed
        self.policy = {"agent": "seeded", "seed": seed, "config": asdict(config)}
        self.sampling = {"kind": "scripted"}

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        """One scripted reply per conversation; the last user turn is the prompt."""
        if len(conversations) != len(seeds):
            raise ValueError("reply_batch needs one seed per conversation")
        replies = []
        for messages, request_seed in zip(conversations, seeds, strict=True):
            prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            rng = random.Random(stable_seed(self.seed, request_seed, prompt))
            replies.append(_scripted_reply(prompt, self.config, rng))
        return replies

    def __call__(self, messages: Messages, seed: int = 0) -> str:
        return self.reply_batch([messages], [seed])[0]


def seeded_agent(
    config: SeededAgentConfig | None = None,
    *,
    seed: int = 0,
    with_id: Behaviour | None = None,
    no_id: Behaviour | None = None,
    off_topic: Behaviour | None = None,
) -> SeededAgent:
    """A scripted, seeded refund agent for offline runs and tests.

    Pass a whole ``SeededAgentConfig`` or override single categories, e.g.
    ``seeded_agent(with_id=Behaviour(right=0.8))``. The same seed and request
    seeds give the same replies on every run.
    """
    config = config or SeededAgentConfig()
    overrides = {
        name: value
        for name, value in (("with_id", with_id), ("no_id", no_id), ("off_topic", off_topic))
        if value is not None
    }
    if overrides:
        config = SeededAgentConfig(**{**config.__dict__, **overrides})
    return SeededAgent(config, seed=seed)


def scripted_agent(seed: int = 0,
                   behaviour: Mapping[str, Mapping[str, float]] | None = None) -> SeededAgent:
    """The hook: ``behaviour`` maps a category to ``{move: probability}`` (moves:
    ``BEHAVIOUR_KEYS``); categories left out keep ``SeededAgentConfig``'s defaults.
    Raises ValueError naming an unknown category or move, or probabilities over 1."""
    overrides: dict[str, Behaviour] = {}
    for name, moves in (behaviour or {}).items():
        if name not in SeededAgentConfig.__dataclass_fields__:
            raise ValueError(f"unknown category {name!r}: use with_id, no_id or off_topic")
        unknown = [key for key in moves if key not in BEHAVIOUR_KEYS]
        if unknown:
            raise ValueError(f"{name}: unknown move {unknown[0]!r}; use "
                             f"{', '.join(BEHAVIOUR_KEYS)}")
        overrides[name] = Behaviour(**{"right": 0.0, **moves})
    return seeded_agent(SeededAgentConfig(**overrides), seed=seed)


def behaviour_help() -> str:
    """What ``--behaviour`` accepts for this environment, with the defaults."""
    defaults = SeededAgentConfig()
    return ("moves right, invent, refund_first, malformed (probabilities; the rest is plain "
            f"prose). Defaults: with_id right:{defaults.with_id.right},"
            f"refund_first:{defaults.with_id.refund_first}; no_id right:{defaults.no_id.right},"
            f"invent:{defaults.no_id.invent}; off_topic right:{defaults.off_topic.right}")
