"""The starter models' build data (the refund environment's ``starter_data`` hook).

The generic build (``posttrain.policy.starters.registry``) asks the environment for everything
that knows the rule: the system prompt, the warm-start dialogues and how to give one a
fresh order id, how customers spell an id (the copy circuit's prefix tokens), the
teacher-forced copy probe, the category whose prompts name an id, the default
behaviour mix and the gate's pass-rate ranges (``STARTER_DATA`` below).

The warm-start dialogues: template prompts answered by a behaviour mix.

Each customer prompt of the template simulator gets one assistant reply drawn from
``BehaviourMix`` (per category: the right move, or one of the typical mistakes) and
one right-move reply. The mix is what makes the base policy *partial*: on with-id
prompts it sometimes looks the order up, sometimes asks for the id again, or
refunds first. A fully converged warm start leaves GRPO nothing to learn (all
samples of a group agree, advantages are zero); a mixed one leaves the choice of
move for GRPO to climb (reference/spike.md section 3).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.envs.refund.prompts import ID_SPELLINGS, simulate
from posttrain.envs.refund.rule import SYSTEM, normalize_order_id

ASK_FOR_ID = (
    "Could you tell me your order number?",
    "I can help with that. What is your order id?",
    "Sorry to hear that. Which order is it? Please send me the order id.",
    "Sure, I will look into it. What is the order number?",
    "Thanks for writing. Can you give me the order id?",
)
OFF_TOPIC_REPLIES = (
    "Sorry, I can only help with orders and refunds.",
    "I'm the refund assistant, so I can't help with that one.",
    "That is outside what I can do here. I handle orders and refunds.",
    "I can't help with that, sorry. Ask me about an order or a refund.",
)


@dataclass(frozen=True)
class BehaviourMix:
    """Shares of the warm-start replies per prompt category (each category sums to 1).

    with-id: ``lookup`` = lookup_order with the customer's id (the only pass);
    ``wrong_id`` = lookup_order with one digit changed, dropped or swapped;
    ``ask`` = asks for the id the customer already gave; ``refund_first`` =
    create_refund before any lookup. no-id: ``ask`` (pass) or ``invent`` (a
    lookup with a made-up id). off-topic: ``short`` reply (pass) or ``invent``.
    """

    with_id_lookup: float = 0.50
    with_id_wrong_id: float = 0.0
    with_id_ask: float = 0.30
    with_id_refund_first: float = 0.20
    no_id_ask: float = 0.92
    no_id_invent: float = 0.08
    off_topic_short: float = 0.96
    off_topic_invent: float = 0.04

    def shares(self, category: str) -> dict[str, float]:
        """``{behaviour: share}`` for one prompt category."""
        prefix = category + "_"
        return {
            name[len(prefix) :]: value
            for name, value in asdict(self).items()
            if name.startswith(prefix)
        }


RIGHT_MOVE = {"with_id": "lookup", "no_id": "ask", "off_topic": "short"}


def _tool_block(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _garbled(order_id: str, rng: random.Random) -> str:
    """``order_id`` with one plausible copying mistake; never the id itself."""
    digits = order_id.split("-", 1)[1]
    while True:
        how = rng.choice(("change", "drop", "swap", "add"))
        chars = list(digits)
        spot = rng.randrange(len(chars))
        if how == "change":
            chars[spot] = str((int(chars[spot]) + rng.randrange(1, 10)) % 10)
        elif how == "drop" and len(chars) > 3:
            del chars[spot]
        elif how == "swap" and spot + 1 < len(chars):
            chars[spot], chars[spot + 1] = chars[spot + 1], chars[spot]
        elif how == "add":
            chars.insert(spot, str(rng.randrange(10)))
        candidate = "ORD-" + "".join(chars)
        if candidate != order_id:
            return candidate


def _reply(behaviour: str, order_id: str | None, rng: random.Random) -> str:
    invented = f"ORD-{rng.randrange(1000, 10000)}"
    if behaviour == "lookup":
        return _tool_block("lookup_order", {"order_id": order_id})
    if behaviour == "wrong_id":
        assert order_id is not None, "wrong_id is a move on prompts that give an id"
        return _tool_block("lookup_order", {"order_id": _garbled(order_id, rng)})
    if behaviour == "refund_first":
        amount = rng.choice((9.99, 15.0, 20.0, 24.5, 39.0, 49.99, 60.0))
        return _tool_block("create_refund", {"order_id": order_id, "amount": amount})
    if behaviour == "invent":
        return _tool_block("lookup_order", {"order_id": invented})
    if behaviour == "ask":
        return rng.choice(ASK_FOR_ID)
    if behaviour == "short":
        return rng.choice(OFF_TOPIC_REPLIES)
    raise ValueError(f"unknown behaviour {behaviour!r}")


def starter_dialogues(
    mix: BehaviourMix, situations: int, data_seed: int
) -> list[dict[str, Any]]:
    """Warm-start rows ``{"prompt", "category", "behaviour", "reply", "right_reply"}``.

    Deterministic. Prompts come from the template simulator (``situations``
    situations, ``data_seed``); each reply's behaviour is drawn from ``mix`` for the
    prompt's category; ``right_reply`` is the right move for the same prompt.
    """
    rng = random.Random(data_seed)
    rows = []
    for record in simulate(situations, seed=data_seed):
        shares = mix.shares(record["category"])
        names = sorted(shares)
        behaviour = rng.choices(names, weights=[shares[n] for n in names])[0]
        order_id = normalize_order_id(record["prompt"])
        rows.append(
            {
                "prompt": record["prompt"],
                "category": record["category"],
                "behaviour": behaviour,
                "reply": _reply(behaviour, order_id, rng),
                "right_reply": _reply(RIGHT_MOVE[record["category"]], order_id, rng),
            }
        )
    return rows


def render_chatml(system: str, prompt: str, reply: str) -> str:
    """One dialogue as ChatML text (what the tokenizer is trained on)."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
        f"<|im_start|>assistant\n{reply}<|im_end|>\n"
    )


def id_token_ids(tokenizer: Any, spellings: Any) -> tuple[list[int], list[int]]:
    """(digit-chunk token ids, order-id prefix token ids) of a starter tokenizer: what the
    copy circuit (``posttrain.policy.starters.copy_circuit``) carries.

    The prefixes are the tokens right before the number in each way a customer
    spells an id (``spellings``, the environment's, e.g. ``ORD-{n}``, ``ord_{n}``,
    ``#ORD-{n}``), read off the tokenizer.
    """
    digits = sorted(i for token, i in tokenizer.get_vocab().items() if token.isdigit())
    prefixes = set()
    for spelling in spellings:
        ids = tokenizer.encode(spelling.format(n=4017), add_special_tokens=False)
        first_digit = next(k for k, i in enumerate(ids) if i in set(digits))
        prefixes.add(ids[first_digit - 1])
    return digits, sorted(prefixes)


_SPELLED_ID = re.compile(r"(\bORD[-_ ]?)(\d{3,6})\b", re.IGNORECASE)


def fresh_order_number(prompt: str, rng: random.Random) -> tuple[str, str | None, str | None]:
    """(``prompt`` with its order number replaced by a random one of the same length, the
    old number, the new one); the customer's spelling (``ord_991``, ``#ORD-991``) is kept.
    Unchanged (and no draw from ``rng``) when the prompt names no order."""
    match = _SPELLED_ID.search(prompt)
    if match is None:
        return prompt, None, None
    old = match.group(2)
    new = str(rng.randrange(10 ** (len(old) - 1), 10 ** len(old)))
    return prompt[: match.start(2)] + new + prompt[match.end(2) :], old, new


def with_fresh_id(row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``row`` with its order number replaced by a new random one, in prompt and replies.

    The customer's spelling (``ord_991``, ``#ORD-991`` ...) is kept. 4,000
    situations hold only a few thousand ids; drawn afresh, no id repeats, so the
    only way to lower the loss on the id is to copy it from the prompt rather
    than to remember which id goes with which sentence.
    """
    prompt, old, new = fresh_order_number(row["prompt"], rng)
    if old is None:
        return row
    fresh = dict(row)
    fresh["prompt"] = prompt
    for name in ("reply", "right_reply"):
        fresh[name] = row[name].replace(f"ORD-{old}", f"ORD-{new}")
    return fresh


# The mix of both: with-id prompts looked up 25%, asked again 50%, refunded first 25%
# (docs/policies.md: with this mix and the copy circuit the base policy passes about a
# third of with-id prompts, two thirds of no-id ones and nearly all off-topic ones).
STARTER_MIX = BehaviourMix(
    with_id_lookup=0.25,
    with_id_ask=0.50,
    with_id_refund_first=0.25,
    no_id_ask=0.96,
    no_id_invent=0.04,
)

# The gate's pass-rate ranges per category (docs/policies.md, "The spec"): broken
# tool-call blocks score 0.0 (the refund rule): a build breaks off a block on up to a
# quarter of its no-id and off-topic replies, which GRPO trains away (well_formed 0.85 ->
# 0.99 in the default run)
SPEC_PASS_RATES = (("with_id", 0.15, 0.55), ("no_id", 0.40, 0.95), ("off_topic", 0.55, 1.00))

_LOOKUP_CALL = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "'


@dataclass(frozen=True)
class RefundStarterData:
    """What the starter build needs to know about the refund rule (module docstring)."""

    system: str = SYSTEM
    id_spellings: tuple[str, ...] = ID_SPELLINGS
    copy_category: str = "with_id"  # prompts that name an id: the copy probe's
    default_mix: BehaviourMix = STARTER_MIX
    spec_pass_rates: tuple[tuple[str, float, float], ...] = SPEC_PASS_RATES

    def dialogues(self, mix: BehaviourMix, situations: int, data_seed: int
                  ) -> list[dict[str, Any]]:
        return starter_dialogues(mix, situations, data_seed)

    def fresh(self, row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        return with_fresh_id(row, rng)

    def render(self, row: dict[str, Any]) -> str:
        """A dialogue as the tokenizer's training text."""
        return render_chatml(SYSTEM, row["prompt"], row["reply"])

    def copy_prompts(self, records: list[dict[str, Any]]) -> list[str]:
        """The prompts of ``records`` that name an id (the copy probe's)."""
        return [r["prompt"] for r in records if r["category"] == self.copy_category]

    def isolated_words(self, rows: list[dict[str, Any]]) -> tuple[str, ...]:
        """Words the tokenizer keeps whole: none (ids split by their prefix and digits)."""
        return ()

    def copy_token_ids(self, tokenizer: Any, rows: list[dict[str, Any]]
                       ) -> tuple[list[int], list[int]]:
        """(digit-chunk token ids, id-prefix token ids): what the copy circuit carries."""
        return id_token_ids(tokenizer, self.id_spellings)

    def copy_probe(self, prompt: str) -> tuple[str, str, str]:
        """(reply forced up to the id's number, the number's prefix as written there,
        the number): the lookup call the copy probe teacher-forces."""
        order_id = normalize_order_id(prompt) or ""
        prefix, _, number = order_id.partition("-")
        return _LOOKUP_CALL, prefix + "-", number


STARTER_DATA = RefundStarterData()
