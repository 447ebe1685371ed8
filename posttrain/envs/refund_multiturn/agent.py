"""The multi-turn refund environment's scripted agent (the ``scripted_agent`` hook).

It plays whole episodes without a model: each turn it reads the conversation so far
(the tool results included) and makes the next move of the behaviour drawn for the
episode. The draw depends on the agent's seed, the prompt and the request seed,
which the episode runner keeps for every turn of an episode, so an episode plays
one behaviour from start to end.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from posttrain.agents import Messages, stable_seed
from posttrain.envs.refund_multiturn.rule import case_for, category
from posttrain.envs.wire import render_tool_call

#: moves the agent can play; the rest of the probability mass is a plain reply
MOVES = ("right", "invent", "refund_first", "wrong_amount", "no_reason", "malformed")
DEFAULT_BEHAVIOUR: dict[str, dict[str, float]] = {
    "eligible": {"right": 0.4, "wrong_amount": 0.2, "refund_first": 0.2},
    "ineligible": {"right": 0.4, "no_reason": 0.3, "refund_first": 0.1},
    "no_id": {"right": 0.5, "invent": 0.2},
    "off_topic": {"right": 0.9},
}
PLAIN = "Thanks for writing. I have made a note of it."


def _draw(shares: Mapping[str, float], rng: random.Random) -> str:
    draw = rng.random()
    for move in MOVES:
        share = shares.get(move, 0.0)
        if draw < share:
            return move
        draw -= share
    return "plain"


def _results(messages: Messages) -> list[dict[str, Any]]:
    """The tool results so far, decoded."""
    out = []
    for message in messages:
        if message.get("role") == "tool":
            try:
                payload = json.loads(message.get("content") or "")
            except ValueError:
                payload = {}
            out.append(payload if isinstance(payload, dict) else {})
    return out


def _next_turn(move: str, case: dict[str, Any], messages: Messages) -> str:
    """The agent's next turn for ``move`` given the conversation so far."""
    results = _results(messages)
    if move == "plain" or category(case) == "off_topic":
        return "Sorry, I can only help with orders and refunds." if move == "right" else PLAIN
    if move == "malformed":
        return '<tool_call>{"name": lookup_order</tool_call>'
    order_id = case.get("order_id")
    if order_id is None:  # no id: ask first, then read the customer's answer
        answer = next((r["customer"] for r in results if "customer" in r), None)
        if move == "invent" and not results:
            return render_tool_call("lookup_order", {"order_id": "ORD-1234"})
        if answer is None:
            return render_tool_call("ask_customer", {"question": "What is your order id?"})
        order_id = answer.removeprefix("It's ").rstrip(".")
    record = next((r for r in results if "price" in r), None)
    if move == "refund_first" and not any("error" in r for r in results):
        return render_tool_call("create_refund", {"amount": 20, "order_id": order_id})
    if record is None:
        return render_tool_call("lookup_order", {"order_id": order_id})
    if record["refundable"]:
        amount = record["price"] if move != "wrong_amount" else round(record["price"] / 2, 2)
        return render_tool_call("create_refund", {"amount": amount, "order_id": order_id})
    if move == "no_reason":
        return "I am sorry, I cannot refund this order."
    return f"I am sorry, I cannot refund {order_id}: it is {record['reason']}."


class ScriptedEpisodeAgent:
    """A seeded scripted agent for multi-turn episodes (a ``BatchAgent``)."""

    def __init__(self, seed: int = 0, behaviour: Mapping[str, Mapping[str, float]] | None = None):
        merged = {name: dict(moves) for name, moves in DEFAULT_BEHAVIOUR.items()}
        for name, moves in (behaviour or {}).items():
            if name not in merged:
                raise ValueError(f"unknown category {name!r}: use {', '.join(merged)}")
            unknown = [key for key in moves if key not in MOVES]
            if unknown:
                raise ValueError(f"{name}: unknown move {unknown[0]!r}; use {', '.join(MOVES)}")
            if any(value < 0 for value in moves.values()) or sum(moves.values()) > 1 + 1e-9:
                raise ValueError(f"{name}: probabilities must be >= 0 and sum to at most 1")
            merged[name] = dict(moves)
        self.behaviour = merged
        self.seed = seed
        self.policy = {"agent": "seeded", "seed": seed, "behaviour": merged}
        self.sampling = {"kind": "scripted"}

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        if len(conversations) != len(seeds):
            raise ValueError("reply_batch needs one seed per conversation")
        replies = []
        for messages, request_seed in zip(conversations, seeds, strict=True):
            prompt = next(m["content"] for m in messages if m["role"] == "user")
            case = case_for(prompt)
            rng = random.Random(stable_seed(self.seed, request_seed, prompt))
            move = _draw(self.behaviour[category(case)], rng)
            replies.append(_next_turn(move, case, messages))
        return replies

    def __call__(self, messages: Messages, seed: int = 0) -> str:
        return self.reply_batch([messages], [seed])[0]


def behaviour_help() -> str:
    """What ``--behaviour`` accepts for this environment, with the defaults."""
    defaults = "; ".join(
        f"{name} " + ",".join(f"{move}:{p}" for move, p in moves.items())
        for name, moves in DEFAULT_BEHAVIOUR.items())
    return (f"moves {', '.join(MOVES)} (probabilities; the rest is a plain reply). "
            f"Defaults: {defaults}")
