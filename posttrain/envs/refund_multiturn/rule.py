"""The multi-turn refund rule: look the order up, then refund it or say why not.

An *episode* is the policy's turns against the desk (``desk.py``): each turn is a
reply; a reply with a ``<tool_call>`` block is executed and its result returned as
a tool message; the episode ends on a plain reply, on a refund that goes through,
or after ``MAX_TURNS`` policy turns. The reward replays the policy's turns on a
fresh desk (tool results written anywhere else are never read) and scores the
whole episode.

Categories by situation: ``eligible`` (the prompt names a refundable order),
``ineligible`` (it names one that is in transit, refunded already, or past the
30-day window), ``no_id`` (about an order, no id: the customer tells it when asked
through ``ask_customer``), ``off_topic``.

Score table (raw episode score; 1.0 passes). "The order" is the customer's: named
in the prompt, or told through ``ask_customer``.

| situation       | episode                                                        | score |
|-----------------|----------------------------------------------------------------|-------|
| any             | a turn opens a ``<tool_call>`` block that does not parse       | 0.0   |
| eligible        | looked the order up, then refunded its total                   | 1.0   |
| eligible        | looked it up, refunded another amount                          | 0.6   |
| eligible        | looked it up, no refund (a plain reply, or the turn limit)     | 0.3   |
| ineligible      | looked it up, no refund, a final reply that gives the reason   | 1.0   |
|                 | (its own reason and no other)                                  |       |
| ineligible      | looked it up, final reply without the reason                   | 0.6   |
| ineligible      | looked it up, then the turn limit                              | 0.3   |
| eligible/inel.  | never looked the order up                                      | 0.0   |
| no_id           | as eligible/ineligible once the customer told the id           |       |
| no_id           | asked through ask_customer, never looked the order up          | 0.2   |
| no_id           | never asked, a plain reply that asks in prose                  | 0.1   |
| no_id           | never asked, anything else                                     | 0.0   |
| off_topic       | a plain reply of 1-400 characters, no tool call                | 1.0   |
| off_topic       | a plain reply over 400 characters                              | 0.3   |
| off_topic       | any tool call, or the turn limit                               | 0.0   |
| with an order   | each tool call that fails (unknown or invented id, refund      | -0.2  |
|                 | before the lookup or of an ineligible order, bad arguments)    |       |

Scores are clamped to [0, 1] and rounded to 3 places. Turns after the episode ended
(after a refund, say) are not scored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.refund.rule import (
    _DOMAIN_WORDS,
    OFF_TOPIC_MAX_CHARS,
    WIRE_FORMAT,
    normalize_order_id,
)
from posttrain.envs.refund_multiturn.book import customer_order_id, order_for
from posttrain.envs.refund_multiturn.desk import Desk
from posttrain.envs.wire import parse_tool_calls, split_turns

#: policy turns per episode (no id: ask, look up, refund = 3, and one to recover)
MAX_TURNS = 4
FAILED_CALL_COST = 0.2

CATEGORIES = ("eligible", "ineligible", "no_id", "off_topic")


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties)}}}


TOOLS: list[dict[str, Any]] = [
    _tool("lookup_order", "Fetch an order by id: item, price, status, refundable, reason.",
          {"order_id": {"type": "string", "description": "The order id, e.g. ORD-4821."}}),
    # the amount first: written right after the lookup result, it sits at a fixed
    # distance from the price there (book.Order.record)
    _tool("create_refund", "Refund an order that was looked up first; ends the conversation.",
          {"amount": {"type": "number", "description": "Amount, at most the order total."},
           "order_id": {"type": "string", "description": "The order id."}}),
    _tool("ask_customer", "Ask the customer something (their order id) and read the answer.",
          {"question": {"type": "string", "description": "What to ask."}}),
]

POLICY = (
    "You are the refund assistant of an online store. "
    "Look an order up with lookup_order before doing anything to it. "
    "If it is refundable, refund its price with create_refund. "
    "If it is not, tell the customer why. "
    "If the customer gives no order id, ask for it with ask_customer. "
    "Never invent an order id. "
    "If the request is not about an order or a refund, say so briefly."
)

# the tools as one signature line each (the full schemas are ``TOOLS``): the prompt is
# part of every training sequence, and the starter reads signatures as well as schemas
SYSTEM = (
    POLICY
    + "\n\nTools:\n"
    + "\n".join(
        f"{tool['function']['name']}({', '.join(tool['function']['parameters']['properties'])})"
        for tool in TOOLS)
    + "\n\n"
    + WIRE_FORMAT
)

# a final reply gives the reason when it names it (the lookup result's reason field)
_REASON_WORDS = {
    "already refunded": re.compile(r"already|been refunded|refunded before", re.I),
    "not delivered yet": re.compile(
        r"not (yet )?(been )?delivered|in transit|on (its|the) way|not arrived|hasn't arrived"
        r"|has not arrived|still shipping", re.I),
    "window": re.compile(r"\b30\b|window|too long ago|too late|days ago|period", re.I),
}


def case_for(prompt: str) -> dict[str, Any]:
    """Ground truth of a prompt: the order id it names (or None), whether it is about
    orders at all, the id the customer can tell when none is named, and whether the
    customer's order is refundable (from the book)."""
    order_id = normalize_order_id(prompt)
    in_domain = order_id is not None or _DOMAIN_WORDS.search(prompt or "") is not None
    customer_id = customer_order_id(prompt) if in_domain and order_id is None else None
    own = order_id or customer_id
    return {
        "order_id": order_id,
        "in_domain": in_domain,
        "customer_id": customer_id,
        "refundable": order_for(own).refundable if own else None,
    }


def category(case: dict[str, Any]) -> str:
    """``eligible``, ``ineligible``, ``no_id`` or ``off_topic``."""
    if case.get("order_id"):
        return "eligible" if case.get("refundable") else "ineligible"
    return "no_id" if case.get("in_domain") else "off_topic"


@dataclass
class Episode:
    """What a replay of the policy's turns found."""

    turns: int = 0  # policy turns scored (the episode's length)
    ended: str = "turn_limit"  # "reply", "refund" or "turn_limit"
    broken: bool = False
    final_reply: str = ""
    invented: bool = False  # a call named an id the customer had not given
    desk: Desk = field(default_factory=lambda: Desk(case={}))

    @property
    def tool_calls(self) -> int:
        return len(self.desk.calls)

    @property
    def failed_calls(self) -> int:
        return sum(not call.ok for call in self.desk.calls)

    def summary(self) -> dict[str, Any]:
        """The episode's counts, as a graded row carries them."""
        return {"turns": self.turns, "tool_calls": self.tool_calls,
                "failed_calls": self.failed_calls, "ended": self.ended}


def replay(turns: list[str], case: dict[str, Any], max_turns: int = MAX_TURNS) -> Episode:
    """Play the policy's turns on a fresh desk, up to the end of the episode."""
    episode = Episode(desk=Desk(case=dict(case)))
    desk = episode.desk
    for turn in turns[:max_turns]:
        episode.turns += 1
        calls = parse_tool_calls(turn)
        if calls is None:
            episode.broken, episode.ended, episode.final_reply = True, "reply", turn
            return episode
        if not calls:
            episode.ended, episode.final_reply = "reply", turn
            return episode
        for call in calls:
            named = normalize_order_id(str(call["arguments"].get("order_id", "")))
            if named is not None and named not in desk.known_ids:
                episode.invented = True
            desk.call(call["name"], call["arguments"])
            if desk.done:
                episode.ended = "refund"
                return episode
    episode.ended = "turn_limit"
    return episode


def _gives_reason(reply: str, reason: str | None) -> bool:
    """The reply names the order's reason and no other (a reply that lists every
    reason would otherwise pass on any ineligible order)."""
    if not reason:
        return False
    own = next((name for name in _REASON_WORDS if reason.startswith(name)), "window")
    named = {name for name, words in _REASON_WORDS.items() if words.search(reply)}
    return named == {own}


def score_episode(episode: Episode, case: dict[str, Any]) -> float:
    """The episode's raw score (the table in the module doc)."""
    if episode.broken:
        return 0.0
    desk = episode.desk
    situation = category(case)
    reply = episode.final_reply.strip()
    if situation == "off_topic":
        if episode.tool_calls or episode.ended != "reply" or not reply:
            return 0.0
        return 1.0 if len(reply) <= OFF_TOPIC_MAX_CHARS else 0.3
    if situation == "no_id" and not desk.told:
        if episode.tool_calls:
            base = 0.0
        else:
            base = 0.1 if episode.ended == "reply" and "?" in reply else 0.0
        return round(max(0.0, base - FAILED_CALL_COST * episode.failed_calls), 3)
    # every case past the two branches above names its order (with an id, or told one)
    assert desk.own_id is not None
    order = order_for(desk.own_id)
    if not desk.looked_up:
        base = 0.2 if situation == "no_id" else 0.0  # no_id here: the customer was asked
    elif order.refundable:
        if desk.refund is None:
            base = 0.3
        else:
            base = 1.0 if abs(desk.refund["amount"] - order.price) < 0.005 else 0.6
    elif episode.ended != "reply":
        base = 0.3
    else:
        base = 1.0 if _gives_reason(reply, order.reason) else 0.6
    return round(min(1.0, max(0.0, base - FAILED_CALL_COST * episode.failed_calls)), 3)


def score(reply: str, case: dict[str, Any]) -> float:
    """Raw score of an episode given as a row's ``reply`` (turns joined by ``TURN_SEPARATOR``)."""
    return score_episode(replay(split_turns(reply), case), case)


def markers(reply: str, case: dict[str, Any]) -> dict[str, float]:
    """0/1 side measurements of an episode: ``well_formed`` (no broken block, the
    guard), ``tool_call``, ``invented_id``, ``looked_up``, ``refunded``, ``turn_limit``,
    ``reason_given`` (the final reply names the order's own reason for no refund)."""
    episode = replay(split_turns(reply), case)
    own = episode.desk.own_id
    reason = order_for(own).reason if own and episode.desk.looked_up else None
    return {
        "well_formed": 0.0 if episode.broken else 1.0,
        "tool_call": 1.0 if episode.tool_calls else 0.0,
        "invented_id": 1.0 if episode.invented else 0.0,
        "looked_up": 1.0 if episode.desk.looked_up else 0.0,
        "refunded": 1.0 if episode.desk.refund is not None else 0.0,
        "turn_limit": 1.0 if episode.ended == "turn_limit" else 0.0,
        "reason_given": 1.0 if episode.ended == "reply" and _gives_reason(
            episode.final_reply, reason) else 0.0,
    }


def messages_for(prompt: str) -> list[dict[str, str]]:
    """The conversation the policy starts from: ``[system, user]``."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
