"""Agents: anything that turns a conversation into a reply.

The simplest agent is a plain callable ``agent(messages) -> str``. An agent that
can do better in bulk (a model) implements the batch protocol instead:

    reply_batch(conversations, seeds) -> list[str]
    policy: dict     # what answered (model, adapter, step), stamped on graded rows
    sampling: dict   # how (temperature, top_p, max_new_tokens, ...)

``seeds`` holds one integer per conversation so a seeded evaluation is
reproducible whatever else shares the batch.

``seeded_agent`` is a scripted, seeded agent for offline runs and tests: per
category it calls the right tool, invents an id, or replies in prose with
configurable probabilities. It needs no model and knows the refund
environment's tools only through the prompt text it is given.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from posttrain.envs.refund import case_for, category

Messages = list[dict[str, str]]


@runtime_checkable
class BatchAgent(Protocol):
    """An agent that answers many conversations at once (see module docstring)."""

    policy: dict[str, Any]
    sampling: dict[str, Any]

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]: ...


Agent = Callable[[Messages], str] | BatchAgent


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text, identical on every Python and platform.

    ``hash()`` is salted per process, so it must never decide sampling.
    """
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


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
