"""A second rule, written the way a user would: the library desk assistant.

The rule: when a reader names a book in quotes, search the catalogue for exactly that
title; when a reader gives a loan number (``LN-`` and 4 digits), renew exactly that
loan; for anything else, answer briefly and call no tool. Different tools and
categories from the built-in refund rule, and every optional hook, so it runs through
every posttrain command:

    posttrain eval --env examples/library_env.py:ENV            # scripted agent
    posttrain prompts write library.jsonl --env examples/library_env.py:ENV
    posttrain grpo --env examples/library_env.py:ENV --base-model starter-2m --steps 10

Score table (raw score; a reply passes at 1.0):

| prompt           | reply                                             | score |
|------------------|---------------------------------------------------|-------|
| names a title    | ``search_catalog`` with that title (any case)     | 1.0   |
| names a title    | ``search_catalog`` with another title             | 0.2   |
| gives a loan no. | ``renew_loan`` with that loan number              | 1.0   |
| gives a loan no. | ``renew_loan`` with another number                | 0.1   |
| either           | the other tool, or plain prose                    | 0.0   |
| chit-chat        | a plain reply of 1 to 200 characters              | 1.0   |
| chit-chat        | a plain reply over 200 characters                 | 0.3   |
| chit-chat        | any tool call                                     | 0.0   |
| any              | a broken ``<tool_call>`` block, or an empty reply | 0.0   |
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
        "name": "search_catalog",
        "description": "Find a book in the catalogue by its title.",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}},
                       "required": ["title"]}}},
    {"type": "function", "function": {
        "name": "renew_loan",
        "description": "Renew a loan by its loan number (LN-dddd).",
        "parameters": {"type": "object", "properties": {"loan": {"type": "string"}},
                       "required": ["loan"]}}},
]
SYSTEM = (
    "You are the library's desk assistant. If the reader names a book, search the "
    "catalogue for that exact title. If the reader gives a loan number, renew that loan. "
    "Otherwise answer briefly and call no tool.\n\nTools:\n"
    + "\n".join(json.dumps(tool["function"], separators=(",", ":")) for tool in TOOLS)
    + "\n\nTo call a tool, reply with exactly one block:\n<tool_call>\n"
    '{"name": "<tool name>", "arguments": {...}}\n</tool_call>\nOtherwise reply in plain text.'
)
CATEGORIES = ("title", "loan", "chitchat")
SHORT_REPLY = 200
_TITLE = re.compile(r'"([^"]{2,80})"')
_LOAN = re.compile(r"\bLN-(\d{4})\b", re.IGNORECASE)


def case_for(prompt: str) -> dict[str, Any]:
    """Ground truth from the text: the quoted title and the loan number, if any."""
    title, loan = _TITLE.search(prompt or ""), _LOAN.search(prompt or "")
    return {"title": title.group(1).strip() if title else None,
            "loan": f"LN-{loan.group(1)}" if loan else None}


def category(case: dict[str, Any]) -> str:
    if case.get("loan"):
        return "loan"
    return "title" if case.get("title") else "chitchat"


def score(reply: str, case: dict[str, Any]) -> float:
    if not reply or not reply.strip():
        return 0.0
    call = parse_tool_call(reply)
    if call is None and "<tool_call>" in reply:
        return 0.0
    kind = category(case)
    if kind == "chitchat":
        if call is not None:
            return 0.0
        return 1.0 if len(reply.strip()) <= SHORT_REPLY else 0.3
    wanted = "renew_loan" if kind == "loan" else "search_catalog"
    if call is None or call["name"] != wanted:
        return 0.0
    if kind == "loan":
        return 1.0 if str(call["arguments"].get("loan", "")).upper() == case["loan"] else 0.1
    given = str(call["arguments"].get("title", "")).strip().lower()
    return 1.0 if given == case["title"].lower() else 0.2


def markers(reply: str, case: dict[str, Any]) -> dict[str, float]:
    call = parse_tool_call(reply)
    broken = call is None and "<tool_call>" in (reply or "")
    return {"well_formed": 0.0 if broken else 1.0, "tool_call": 1.0 if call else 0.0}


# --- the prompt writer: templates, seeded, no model ---------------------------------

ADJECTIVES = ("Quiet", "Salted", "Northern", "Glass", "Hidden", "Winter", "Long", "Paper",
              "Silver", "Last", "Crooked", "Open")
NOUNS = ("Orchard", "Harbour", "Lantern", "Stair", "Garden", "Map", "Letter", "River",
         "Clock", "Meadow", "Tower", "Bridge")
TITLE_TEMPLATES = ('Do you have "{title}"?', 'I am looking for "{title}", is it in?',
                   'Could you find "{title}" for me?', 'Is "{title}" on the shelves today?')
LOAN_TEMPLATES = ("Please renew my loan {loan}.", "Can I keep {loan} a bit longer?",
                  "My loan {loan} is due tomorrow, renew it please.",
                  "Renew {loan} for me, thanks.")
CHAT_TEMPLATES = ("When do you open on {day}?", "Is the reading room busy on {day}?",
                  "Can I bring my {thing} inside?", "Where can I leave my {thing}?",
                  "Is there a {event} on {day}?", "Who runs the {event}?")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
THINGS = ("bike", "dog", "coffee", "umbrella", "laptop", "guitar")
EVENTS = ("poetry evening", "chess club", "story hour", "book sale", "film night")


def write_prompts(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` situations, one or two phrasings each, with scenario ids and categories.

    A third of the situations per category; the first phrasing of a situation is its
    ``seed`` (what ``posttrain prompts filter`` checks the others' category against).
    """
    rng = random.Random(seed)
    records, seen = [], set()
    for index in range(count):
        kind = CATEGORIES[index % len(CATEGORIES)]
        scenario = hashlib.sha256(f"library:{seed}:{index}".encode()).hexdigest()[:12]
        values = {"title": f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}",
                  "loan": f"LN-{rng.randrange(1000, 10000)}", "day": rng.choice(DAYS),
                  "thing": rng.choice(THINGS), "event": rng.choice(EVENTS)}
        templates = {"title": TITLE_TEMPLATES, "loan": LOAN_TEMPLATES,
                     "chitchat": CHAT_TEMPLATES}[kind]
        phrasings = [t.format(**values) for t in rng.sample(templates, 2 if rng.random() < 0.3
                                                               else 1)]
        for prompt in phrasings:
            if prompt in seen:
                continue
            seen.add(prompt)
            case = case_for(prompt)
            records.append({"prompt": prompt, "scenario_id": scenario,
                            "category": category(case), "case": case, "seed": phrasings[0]})
    return records


# --- the scripted agent: right moves and known mistakes, seeded ----------------------

MOVES = ("right", "wrong_tool", "chatter")


@dataclass
class ScriptedLibrarian:
    """Per category, ``{move: probability}``; the rest of the mass is a long ramble."""

    seed: int = 0
    behaviour: dict[str, dict[str, float]] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=lambda: {"kind": "scripted"})

    def __post_init__(self) -> None:
        self.policy = {"agent": "library-scripted", "seed": self.seed,
                       "behaviour": self.behaviour}

    def reply_batch(self, conversations: list[list[dict[str, str]]],
                    seeds: list[int]) -> list[str]:
        return [self._reply(messages[-1]["content"], seed)
                for messages, seed in zip(conversations, seeds, strict=True)]

    def _reply(self, prompt: str, seed: int) -> str:
        digest = hashlib.sha256(f"{self.seed}\x1f{seed}\x1f{prompt}".encode()).digest()
        draw = random.Random(int.from_bytes(digest[:4], "big")).random()
        case = case_for(prompt)
        kind = category(case)
        moves = {"right": 0.7, "wrong_tool": 0.1, "chatter": 0.1,
                 **self.behaviour.get(kind, {})}
        for move in MOVES:
            if draw < moves[move]:
                return self._move(move, kind, case)
            draw -= moves[move]
        return "Let me tell you all about our library. " * 8

    @staticmethod
    def _move(move: str, kind: str, case: dict[str, Any]) -> str:
        if move == "chatter":
            return "Happy to help!"
        if move == "wrong_tool" or kind == "chitchat":
            if kind == "chitchat" and move == "right":
                return "Sorry, I can only tell you that at the desk."
            return render_tool_call("renew_loan" if kind != "loan" else "search_catalog",
                                    {"loan": "LN-0000", "title": "Unknown"})
        if kind == "loan":
            return render_tool_call("renew_loan", {"loan": case["loan"]})
        return render_tool_call("search_catalog", {"title": case["title"]})


@dataclass(frozen=True)
class LibraryEnv:
    """The library rule as an environment object, with every optional hook."""

    name: str = "library"
    categories: tuple[str, ...] = CATEGORIES
    tools: list[dict[str, Any]] = field(default_factory=lambda: TOOLS)
    system: str = SYSTEM
    # what the reward pays for on purpose: the right tool per category, short chit-chat
    rewarded_features: dict[str, tuple[str, ...]] = field(default_factory=lambda: {
        "*": ("marker:well_formed",),
        "title": ("tool:search_catalog", "tool_call"),
        "loan": ("tool:renew_loan", "tool_call"),
        "chitchat": ("-length",),
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

    # optional hooks
    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        return write_prompts(count, seed)

    def scripted_agent(self, seed: int = 0,
                       behaviour: dict[str, dict[str, float]] | None = None) -> Any:
        for kind, moves in (behaviour or {}).items():
            unknown = [move for move in moves if move not in MOVES]
            if unknown:
                raise ValueError(f"{kind}: unknown move {unknown[0]!r}; use {', '.join(MOVES)}")
        return ScriptedLibrarian(seed=seed, behaviour=dict(behaviour or {}))

    def reference_agent(self, seed: int = 0) -> Any:
        """The right move on every prompt: what a starter for this rule is taught."""
        return ScriptedLibrarian(seed=seed, behaviour={kind: {"right": 1.0}
                                                       for kind in CATEGORIES})

    def behaviour_help(self) -> str:
        return "moves right, wrong_tool, chatter (the rest: a long ramble)"

    def constructed_negative(self, prompt: str, case: dict[str, Any]) -> str | None:
        """On chit-chat, a catalogue search nobody asked for."""
        if category(case) != "chitchat":
            return None
        return render_tool_call("search_catalog", {"title": prompt[:40]})


ENV = LibraryEnv()


@dataclass(frozen=True)
class BareLibraryEnv(LibraryEnv):
    """The same rule with no prompt writer: commands need ``--prompts-file``."""

    write_prompts = None  # type: ignore[assignment]


BARE_ENV = BareLibraryEnv()


@dataclass(frozen=True)
class UnguidedLibraryEnv(LibraryEnv):
    """The same rule with no reference agent, as most rules a user brings (and every
    verifiers, inspect or OpenEnv environment) are: a GRPO run's automatic cold start
    then learns from the policy's own passing replies (``--cold-start self``)."""

    reference_agent = None  # type: ignore[assignment]


NO_REFERENCE_ENV = UnguidedLibraryEnv()
