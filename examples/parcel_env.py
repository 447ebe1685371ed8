"""A third rule, of another shape: the parcel desk, with three tools and computed arguments.

The rule: a customer who gives a tracking code (``PK-`` and 5 digits) gets
``track_parcel`` with exactly that code; a customer who asks for a pickup gets
``book_pickup`` with the day they named and the number of parcels, which they write as
a word ("three parcels": ``parcels`` is the integer 3, computed, not copied); a customer
who asks what sending costs gets ``quote_postage`` with the weight in kilograms (a
number) and the country; anything else gets a short answer and no tool. Where the
library example copies one string into one argument, this one fills two arguments
per call and turns a word into a number:

    posttrain eval --env examples/parcel_env.py:ENV            # scripted agent
    posttrain grpo --env examples/parcel_env.py:ENV            # its own starter, built first

Score table (raw score; a reply passes at 1.0):

| prompt            | reply                                                  | score |
|-------------------|--------------------------------------------------------|-------|
| gives a code      | ``track_parcel`` with that code                        | 1.0   |
| asks for a pickup | ``book_pickup`` with the day and the parcel count      | 1.0   |
| asks for postage  | ``quote_postage`` with the weight and the country      | 1.0   |
| any of those      | the right tool with a wrong or missing argument        | 0.2   |
| any of those      | another tool, or plain prose                           | 0.0   |
| anything else     | a plain reply of 1 to 160 characters, no tool          | 1.0   |
| anything else     | a longer plain reply                                   | 0.3   |
| any               | a broken ``<tool_call>`` block, or an empty reply      | 0.0   |
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.wire import parse_tool_call, render_tool_call

TOOLS = [
    {"type": "function", "function": {
        "name": "track_parcel", "description": "Where a parcel is, by its tracking code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}},
    {"type": "function", "function": {
        "name": "book_pickup", "description": "Book a courier to collect parcels.",
        "parameters": {"type": "object", "properties": {
            "day": {"type": "string"}, "parcels": {"type": "integer"}},
            "required": ["day", "parcels"]}}},
    {"type": "function", "function": {
        "name": "quote_postage", "description": "The price of sending a parcel abroad.",
        "parameters": {"type": "object", "properties": {
            "weight_kg": {"type": "number"}, "country": {"type": "string"}},
            "required": ["weight_kg", "country"]}}},
]
SYSTEM = (
    "You are the parcel desk. A tracking code gets track_parcel; a pickup request gets "
    "book_pickup with the day and how many parcels; a question about the price gets "
    "quote_postage with the weight in kg and the country. Otherwise answer briefly and "
    "call no tool.\n\nTools:\n"
    + "\n".join(json.dumps(tool["function"], separators=(",", ":")) for tool in TOOLS)
    + "\n\nTo call a tool, reply with exactly one block:\n<tool_call>\n"
    '{"name": "<tool name>", "arguments": {...}}\n</tool_call>\nOtherwise reply in plain text.'
)
CATEGORIES = ("track", "pickup", "postage", "other")
SHORT_REPLY = 160
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
COUNTRIES = ("Spain", "France", "Norway", "Japan", "Canada", "Italy", "Chile", "Kenya")
_CODE = re.compile(r"\bPK-(\d{5})\b")
_PICKUP = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r") parcels?\b.*?\b("
                     + "|".join(DAYS) + r")\b|\b(" + "|".join(DAYS) + r")\b.*?\b("
                     + "|".join(NUMBER_WORDS) + r") parcels?\b", re.IGNORECASE)
_POSTAGE = re.compile(r"\b(\d{1,2}) ?kg\b.*?\b(" + "|".join(COUNTRIES) + r")\b")


def case_for(prompt: str) -> dict[str, Any]:
    """Ground truth from the text: the code, or the pickup's day and count, or the
    postage's weight and country; nothing for anything else."""
    text = prompt or ""
    if code := _CODE.search(text):
        return {"kind": "track", "code": f"PK-{code.group(1)}"}
    if pickup := _PICKUP.search(text):
        word = (pickup.group(1) or pickup.group(4)).lower()
        day = (pickup.group(2) or pickup.group(3)).capitalize()
        return {"kind": "pickup", "day": day, "parcels": NUMBER_WORDS.index(word) + 1}
    if postage := _POSTAGE.search(text):
        return {"kind": "postage", "weight_kg": int(postage.group(1)),
                "country": postage.group(2)}
    return {"kind": "other"}


def category(case: dict[str, Any]) -> str:
    return str(case.get("kind", "other"))


WANTED = {"track": ("track_parcel", ("code",)), "pickup": ("book_pickup", ("day", "parcels")),
          "postage": ("quote_postage", ("weight_kg", "country"))}


def _same(given: Any, wanted: Any) -> bool:
    if isinstance(wanted, str):
        return isinstance(given, str) and given.strip().lower() == wanted.lower()
    return isinstance(given, (int, float)) and not isinstance(given, bool) and given == wanted


def score(reply: str, case: dict[str, Any]) -> float:
    if not reply or not reply.strip():
        return 0.0
    call = parse_tool_call(reply)
    if call is None and "<tool_call>" in reply:
        return 0.0
    kind = category(case)
    if kind == "other":
        if call is not None:
            return 0.0
        return 1.0 if len(reply.strip()) <= SHORT_REPLY else 0.3
    tool, names = WANTED[kind]
    if call is None or call["name"] != tool:
        return 0.0
    arguments = call["arguments"]
    return 1.0 if all(_same(arguments.get(name), case[name]) for name in names) else 0.2


def markers(reply: str, case: dict[str, Any]) -> dict[str, float]:
    call = parse_tool_call(reply)
    broken = call is None and "<tool_call>" in (reply or "")
    return {"well_formed": 0.0 if broken else 1.0, "tool_call": 1.0 if call else 0.0}


# --- the prompt writer: templates, seeded, no model ---------------------------------

TRACK = ("Where is my parcel PK-{code}?", "Can you track PK-{code} for me?",
         "My tracking code is PK-{code}, has it left yet?", "Any news on PK-{code}?")
PICKUP = ("Please collect {count} parcels on {day}.", "Can a courier pick up {count} parcels "
          "on {day}?", "I have {count} parcels ready, come on {day} please.",
          "Book a pickup for {day}, {count} parcels.")
POSTAGE = ("How much to send {kg} kg to {country}?", "What does a {kg} kg parcel to {country} "
           "cost?", "Price for {kg} kg going to {country}, please.")
OTHER = ("Do you sell boxes?", "What time do you close on {day}?", "Is the desk open on {day}?",
         "Can I pay by card?", "Do you have tape I could borrow?", "Where do I park?")


def write_prompts(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` situations (a quarter per category), one phrasing each, seeded."""
    rng = random.Random(seed)
    records, seen = [], set()
    for index in range(count):
        kind = CATEGORIES[index % len(CATEGORIES)]
        values = {"code": rng.randrange(10000, 100000), "day": rng.choice(DAYS),
                  "count": rng.choice(NUMBER_WORDS[1:]), "kg": rng.randrange(1, 30),
                  "country": rng.choice(COUNTRIES)}
        templates = {"track": TRACK, "pickup": PICKUP, "postage": POSTAGE, "other": OTHER}[kind]
        prompt = rng.choice(templates).format(**values)
        if prompt in seen:
            continue
        seen.add(prompt)
        case = case_for(prompt)
        scenario = hashlib.sha256(f"parcel:{seed}:{index}".encode()).hexdigest()[:12]
        records.append({"prompt": prompt, "scenario_id": scenario, "category": category(case),
                        "case": case})
    return records


# --- agents: the right move, and the known mistakes ----------------------------------

MOVES = ("right", "wrong_tool", "wrong_argument", "chatter")


def right_move(case: dict[str, Any]) -> str:
    kind = category(case)
    if kind == "other":
        return "Please ask at the counter, they will sort it out."
    tool, names = WANTED[kind]
    return render_tool_call(tool, {name: case[name] for name in names})


def mistake(move: str, case: dict[str, Any], rng: random.Random) -> str:
    kind = category(case)
    if move == "chatter":
        return "Of course, happy to help with your parcel!"
    if move == "wrong_argument" and kind != "other":
        tool, names = WANTED[kind]
        arguments = {name: case[name] for name in names}
        name = rng.choice(names)
        value = arguments[name]
        arguments[name] = (value % 9 + 1 if isinstance(value, int)
                           else rng.choice([d for d in (*DAYS, *COUNTRIES) if d != value])
                           if name != "code" else "PK-00000")
        return render_tool_call(tool, arguments)
    others = [tool for k, (tool, _) in WANTED.items() if k != kind]
    return render_tool_call(rng.choice(others), {})


@dataclass
class ScriptedClerk:
    """Per category ``{move: probability}``; the default is mostly right."""

    seed: int = 0
    behaviour: dict[str, dict[str, float]] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=lambda: {"kind": "scripted"})

    def __post_init__(self) -> None:
        self.policy = {"agent": "parcel-scripted", "seed": self.seed,
                       "behaviour": self.behaviour}

    def reply_batch(self, conversations: list[list[dict[str, str]]],
                    seeds: list[int]) -> list[str]:
        return [self._reply(messages[-1]["content"], seed)
                for messages, seed in zip(conversations, seeds, strict=True)]

    def _reply(self, prompt: str, seed: int) -> str:
        digest = hashlib.sha256(f"{self.seed}\x1f{seed}\x1f{prompt}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:4], "big"))
        case = case_for(prompt)
        moves = {"right": 0.6, "wrong_tool": 0.15, "wrong_argument": 0.15, "chatter": 0.1,
                 **self.behaviour.get(category(case), {})}
        draw = rng.random()
        for move in MOVES:
            if draw < moves.get(move, 0.0):
                return right_move(case) if move == "right" else mistake(move, case, rng)
            draw -= moves.get(move, 0.0)
        return "Let me explain everything about our parcel services. " * 5


@dataclass(frozen=True)
class ParcelEnv:
    """The parcel rule as an environment object."""

    name: str = "parcel"
    categories: tuple[str, ...] = CATEGORIES
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    system: str = SYSTEM
    rewarded_features: dict[str, tuple[str, ...]] = field(default_factory=lambda: {
        "*": ("marker:well_formed",),
        "track": ("tool:track_parcel", "tool_call"),
        "pickup": ("tool:book_pickup", "tool_call"),
        "postage": ("tool:quote_postage", "tool_call"),
        "other": ("-length",),
    })

    def messages_for(self, prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": prompt}]

    def case_for(self, prompt: str) -> dict[str, Any]:
        return case_for(prompt)

    def category(self, case: dict[str, Any]) -> str:
        return category(case)

    def score(self, reply: str, case: dict[str, Any]) -> float:
        return score(reply, case)

    def markers(self, reply: str, case: dict[str, Any]) -> dict[str, float]:
        return markers(reply, case)

    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        return write_prompts(count, seed)

    def scripted_agent(self, seed: int = 0,
                       behaviour: dict[str, dict[str, float]] | None = None) -> Any:
        for kind, moves in (behaviour or {}).items():
            unknown = [move for move in moves if move not in MOVES]
            if unknown:
                raise ValueError(f"{kind}: unknown move {unknown[0]!r}; use {', '.join(MOVES)}")
        return ScriptedClerk(seed=seed, behaviour=dict(behaviour or {}))

    def reference_agent(self, seed: int = 0) -> Any:
        """The right move on every prompt."""
        return ScriptedClerk(seed=seed, behaviour={kind: {"right": 1.0}
                                                   for kind in CATEGORIES})

    def behaviour_help(self) -> str:
        return "moves right, wrong_tool, wrong_argument, chatter (the rest: a long ramble)"


ENV = ParcelEnv()
