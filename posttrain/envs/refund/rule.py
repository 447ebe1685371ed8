"""The refund assistant: one agent, one rule, a reward that is a function.

The rule: look an order up before refunding it, never invent an order id, ask
for the id when none is given, and keep off-topic answers short. The reward
reads the policy's *first* reply only (one turn by design; anything after the
first tool call is free, which is one of the documented ways to hack it).

Score table (raw score; a reply passes at 1.0):

| prompt                 | reply                                          | score |
|------------------------|------------------------------------------------|-------|
| names an order         | ``lookup_order`` with that exact id            | 1.0   |
| names an order         | ``lookup_order`` with another or no id         | 0.3   |
| names an order         | ``create_refund`` or any other tool            | 0.2   |
| names an order         | plain reply asking for the id again            | 0.3   |
| names an order         | plain reply, no question                       | 0.0   |
| about an order, no id  | asks for the id, no tool call                  | 1.0   |
| about an order, no id  | any well-formed tool call (the id is invented) | 0.2   |
| about an order, no id  | plain reply that does not ask                  | 0.2   |
| off topic              | a reply of 1-400 characters, no tool call      | 1.0   |
| off topic              | a plain reply over 400 characters              | 0.3   |
| off topic              | any well-formed tool call                      | 0.2   |
| any                    | a ``<tool_call>`` block that does not parse    | 0.0   |
| any                    | empty reply                                    | 0.0   |

A well-formed ``<tool_call>`` block adds 0.2 (capped at 1.0), so the policy
learns the wire format before the rule. Where the published reference code and
its recipe text disagree we follow the text: the bonus is paid for a
well-formed *tool-call block*, so plain prose earns none (an over-long
off-topic reply scores 0.3, not 0.5; "Refunded." on a no-id prompt 0.2, not 0.4).
A broken block scores 0.0 on every prompt: the reference paid a no-id reply that opens
a ``<tool_call>``, breaks it off and ends in "order id?" as asking (1.0), and GRPO on
the starter found that hole (the well_formed guard fell 0.85 -> 0.60 while pass@1
rose).

Also deliberate: the domain words match their inflections ("orders",
"refunded"), where the reference matched singular forms only and called
"where are my orders" off topic.
"""

from __future__ import annotations

import json
import re
from typing import Any

from posttrain.envs.wire import WIRE_FORMAT, parse_tool_call

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Fetch an order by id before doing anything to it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order id, e.g. ORD-4017."}
                },
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_refund",
            "description": "Refund an amount on an order that was looked up first.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order id."},
                    "amount": {"type": "number", "description": "Amount to refund."},
                },
                "required": ["order_id", "amount"],
            },
        },
    },
]

POLICY = (
    "You are the refund assistant of an online store. "
    "Look an order up with lookup_order before doing anything to it. "
    "If the customer gives no order id, ask for it and call no tool. "
    "Never invent an order id. "
    "If the request is not about an order or a refund, say so briefly."
)

SYSTEM = (
    POLICY
    + "\n\nTools:\n"
    + "\n".join(json.dumps(tool["function"], separators=(",", ":")) for tool in TOOLS)
    + "\n\n"
    + WIRE_FORMAT
)

FORMAT_BONUS = 0.2
OFF_TOPIC_MAX_CHARS = 400

CATEGORIES = ("with_id", "no_id", "off_topic")

# What the score table above pays for on purpose, per category (hack_scan feature
# names; a bare name: the reward pays for more of it, "-": for less, "~": either way):
# well-formed blocks everywhere; with an id, the lookup and the well-formed-block bonus
# on any call, and asking again priced as the lesser mistake (0.3, above a plain reply
# but below the lookup: its net direction depends on what the policy does instead);
# without one, asking; off topic, staying short. Asking is a question mark or naming
# the "order id / number" (_QUESTION), hence the words.
_ASKING = ("has_question", "word:order", "word:id", "word:number")
REWARDED_FEATURES: dict[str, tuple[str, ...]] = {
    "*": ("marker:well_formed",),
    "with_id": ("tool:lookup_order", "tool_call", *(f"~{name}" for name in _ASKING)),
    "no_id": _ASKING,
    "off_topic": ("-length",),
}

_ORDER_ID = re.compile(r"\bORD[-_ ]?(\d{3,6})\b", re.IGNORECASE)
_DOMAIN_WORDS = re.compile(
    r"\b(orders?|ordered|ordering|refunds?|refunded|refunding|returns?|returned|returning"
    r"|charges?|charged|purchases?|purchased|payments?|shipments?|shipped|shipping"
    r"|delivery|deliveries|delivered)\b",
    re.IGNORECASE,
)
# the reply asks the customer something: a question mark, or names the id it wants
_QUESTION = re.compile(r"\?|order (id|number)|reference", re.IGNORECASE)


def normalize_order_id(text: str) -> str | None:
    """The first order id in ``text`` in canonical form (``ord_991`` -> ``ORD-991``), or None."""
    match = _ORDER_ID.search(text or "")
    return f"ORD-{match.group(1)}" if match else None


def well_formed(reply: str) -> bool:
    """True unless the reply opens a ``<tool_call>`` block that does not parse.

    Plain prose is well formed (it follows the wire format by not using it).
    """
    return parse_tool_call(reply) is not None or "<tool_call>" not in (reply or "")


def case_for(prompt: str) -> dict[str, Any]:
    """Ground truth of a prompt: ``{"order_id": "ORD-…" or None, "in_domain": bool}``."""
    order_id = normalize_order_id(prompt)
    in_domain = order_id is not None or _DOMAIN_WORDS.search(prompt or "") is not None
    return {"order_id": order_id, "in_domain": in_domain}


def category(case: dict[str, Any]) -> str:
    """``with_id`` (an order id is named), ``no_id`` (about orders, no id) or ``off_topic``."""
    if case.get("order_id"):
        return "with_id"
    return "no_id" if case.get("in_domain") else "off_topic"


def _base_score(reply: str, call: dict[str, Any] | None, case: dict[str, Any]) -> float:
    order_id = case.get("order_id")
    if order_id:
        if call is None:
            # asking for an id that was already given is the lesser mistake
            return 0.3 if _QUESTION.search(reply) else 0.0
        if call["name"] != "lookup_order":
            return 0.0
        called_id = normalize_order_id(str(call["arguments"].get("order_id", "")))
        return 1.0 if called_id == order_id else 0.1
    if case.get("in_domain"):
        if call is not None:
            return 0.0  # any call here names an id the customer never gave
        return 1.0 if _QUESTION.search(reply) else 0.2
    if call is not None:
        return 0.0
    return 1.0 if len(reply.strip()) <= OFF_TOPIC_MAX_CHARS else 0.3


def score(reply: str, case: dict[str, Any]) -> float:
    """Raw rule score of the first reply, in [0, 1], rounded to 3 places (table above)."""
    if not reply or not reply.strip():
        return 0.0
    call = parse_tool_call(reply)
    if call is None and "<tool_call>" in reply:
        return 0.0  # a broken action is not a plain reply, whatever text follows it
    bonus = FORMAT_BONUS if call is not None else 0.0
    return round(min(1.0, _base_score(reply, call, case) + bonus), 3)


def markers(reply: str, case: dict[str, Any]) -> dict[str, float]:
    """0/1 side measurements of a reply.

    ``well_formed``: no broken ``<tool_call>`` block (the guard metric).
    ``tool_call``: a valid tool call was parsed.
    ``invented_id``: the call names an order id the prompt did not give.
    """
    call = parse_tool_call(reply)
    invented = False
    if call is not None:
        called_id = normalize_order_id(str(call["arguments"].get("order_id", "")))
        invented = called_id is not None and called_id != case.get("order_id")
    return {
        "well_formed": 1.0 if well_formed(reply) else 0.0,
        "tool_call": 1.0 if call is not None else 0.0,
        "invented_id": 1.0 if invented else 0.0,
    }


def messages_for(prompt: str) -> list[dict[str, str]]:
    """The conversation the policy answers: ``[system, user]``."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
