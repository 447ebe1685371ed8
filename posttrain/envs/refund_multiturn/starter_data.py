"""Warm-start episodes for the multi-turn starter (the ``starter_dialogue`` hook).

The multi-turn starter is the single-turn starter taught to play the desk
(``posttrain.policy.starters.episodes``). Each training draw is one episode on a prompt
of this environment's writer, with a fresh order number when the prompt names one (so
ids are copied, never remembered), played by the scripted moves below against a real
desk, so every tool result in the data is the one the desk returns.

``right`` draws play the rule's right move; the others draw a move from
``STARTER_MIX``: the right move or a typical mistake. The mix makes the starter a
*partial* policy, so GRPO has choices to compare: a refund of the wrong amount,
a refund before the lookup, a refusal without the reason, asking in prose instead of
through ``ask_customer``, an invented id, and off topic, asking the customer for an
order that does not exist (without that mistake off-topic groups all pass and carry
no signal that holds them when the other categories push towards tool calls).
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.envs.refund.starter_data import fresh_order_number
from posttrain.envs.refund_multiturn.agent import _next_turn
from posttrain.envs.refund_multiturn.desk import Desk
from posttrain.envs.refund_multiturn.rule import MAX_TURNS, case_for, category, messages_for
from posttrain.envs.wire import parse_tool_calls, render_tool_call

STARTER_MIX: dict[str, dict[str, float]] = {
    "eligible": {"right": 0.35, "wrong_amount": 0.25, "refund_first": 0.2, "no_refund": 0.2},
    "ineligible": {"right": 0.35, "no_reason": 0.45, "refund_first": 0.2},
    "no_id": {"right": 0.4, "prose_ask": 0.4, "invent": 0.2},
    "off_topic": {"right": 0.85, "ask": 0.15},
}
PROSE_ASKS = ("Could you tell me your order number?", "What is your order id?")
OFF_TOPIC_REPLY = "Sorry, I can only help with orders and refunds."
NOTED = "Thanks for writing. I have made a note of it."


def _turn(move: str, case: dict[str, Any], conversation: list[dict[str, Any]],
          played: int, rng: random.Random) -> str:
    if move == "prose_ask":
        return rng.choice(PROSE_ASKS)
    if move == "no_refund":
        return NOTED if played == 0 else "I have looked at your order and made a note of it."
    if move == "ask":  # off topic: ask for an order, then give up
        if played == 0:
            return render_tool_call("ask_customer", {"question": "What is your order id?"})
        return OFF_TOPIC_REPLY
    return _next_turn(move, case, conversation)


def play(prompt: str, move: str, rng: random.Random, system: list[dict[str, Any]]
         ) -> list[dict[str, Any]]:
    """The episode ``move`` plays on ``prompt``: assistant turns and desk results."""
    case = case_for(prompt)
    desk = Desk(case=case)
    turns: list[dict[str, Any]] = []
    for played in range(MAX_TURNS):
        text = _turn(move, case, system + turns, played, rng)
        turns.append({"role": "assistant", "content": text})
        calls = parse_tool_calls(text)
        if not calls:
            break
        for call in calls:
            turns.append({"role": "tool", "name": call["name"],
                          "content": desk.call(call["name"], call["arguments"])})
        if desk.done:
            break
    return turns


def starter_dialogue(prompt: str, right: bool, rng: random.Random
                     ) -> tuple[str, str, list[dict[str, Any]]]:
    """(prompt with a fresh id, move played, episode turns) for one warm-start draw."""
    prompt = fresh_order_number(prompt, rng)[0]
    shares = STARTER_MIX[category(case_for(prompt))]
    if right:
        move = "right"
    else:
        names = sorted(shares)
        move = rng.choices(names, weights=[shares[name] for name in names])[0]
    return prompt, move, play(prompt, move, rng, messages_for(prompt))
