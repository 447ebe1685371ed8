"""The template prompt simulator: customer messages from templates, no model, no key.

``simulate(n_situations, seed)`` draws *situations* (a customer kind, a tone, an
intent, and for order intents an order id or none) and writes each into one or
two customer messages (phrasings). Every prompt carries the ``scenario_id`` of
its situation, its ``category`` and ``case`` (ground truth read back from the
text by the environment), and ``seed`` (the template it came from).

Reproducibility: only ``random.Random(seed)`` draws (``random()``, ``randrange``,
``choice``), whose algorithms are stable across CPython 3.10-3.14, and ids come
from SHA-256, never ``hash()``; nothing iterates a set. The same seed gives the
same prompt set byte for byte (``posttrain.data.prompts.prompt_set_sha256`` pins it
in the tests). This is the refund environment's ``write_prompts`` hook.

Duplicates (the same text, case and whitespace folded) are dropped, keeping
the first, so the set can hold fewer prompts than situations times phrasings.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from posttrain.envs.refund.rule import case_for, category
from posttrain.text import folded

# share of situations per category: with-id dominates (as in real support
# traffic and the recipe), while no-id and off-topic stay large enough for the
# category table to measure them
CATEGORY_SHARES = (("with_id", 0.55), ("no_id", 0.27), ("off_topic", 0.18))
SECOND_PHRASING_SHARE = 0.3

TONE_OPENERS = {
    "polite": ("Hello,", "Hi there,", "Good morning,", "Hi, hope you are well.", ""),
    "curt": ("", "", "Quick one:"),
    "angry": ("This is ridiculous.", "I am really annoyed.", "Seriously?", "Unacceptable."),
    "confused": ("Hi, I'm a bit confused.", "Not sure who to ask, but", "Um, hello?"),
    "chatty": ("Hey! Long story short,", "Hi!! So funny thing,", "Hello hello,"),
}
TONE_CLOSERS = {
    "polite": ("Thank you!", "Thanks in advance.", "Many thanks.", ""),
    "curt": ("", "Thanks."),
    "angry": ("Fix this now.", "I want this sorted today.", "Very disappointed.", ""),
    "confused": ("Can you help?", "What should I do?", "Sorry if this is the wrong place."),
    "chatty": ("Anyway, thanks a bunch!", "Have a lovely day :)", "Cheers!"),
}
CUSTOMER_KINDS = {
    "first_time": ("It's my first time buying here.", "I'm new to your store."),
    "business": ("I'm ordering for my company.", "This is for our business account."),
    "repeat_contact": ("I already wrote to you about this.", "This is my second message."),
    "in_a_hurry": ("I'm in a hurry.", "Please be quick."),
    "non_native": ("Sorry for my english.", "English is not my first language."),
    "typo_prone": ("sorry typing on my phone", "excuse typos"),
}

# intents about an order; {id} is replaced by the order id as the customer wrote it
WITH_ID_TEMPLATES = {
    "refund": (
        "I want a refund for order {id}.",
        "Please refund {id}, the item broke after two days.",
        "Can I get my money back for {id}?",
        "Refund {id} please.",
        "I'd like a refund on my order {id}, it was not what I expected.",
    ),
    "status": (
        "Where is my order {id}? It has not arrived.",
        "What's the status of {id}?",
        "My package {id} is late, can you check on it?",
        "Order {id} still shows as processing, what is going on?",
    ),
    "damaged": (
        "Order {id} arrived damaged, I want a refund.",
        "The box for {id} was crushed and the item is broken.",
        "Everything in {id} came smashed.",
    ),
    "wrong_item": (
        "I got the wrong item in order {id}.",
        "{id} had a blue shirt instead of the red one I ordered.",
        "You sent me someone else's stuff, order {id}.",
    ),
    "double_charge": (
        "I was charged twice for order {id}.",
        "My card shows two payments for {id}, please refund one.",
        "Double charge on {id}!",
    ),
    "cancel": (
        "Please cancel order {id} and refund me.",
        "Can you cancel {id}? I changed my mind.",
        "I need to cancel my purchase {id} before it ships.",
    ),
    "return": (
        "How do I return the shoes from order {id}?",
        "I want to return {id}, it doesn't fit.",
        "Return request for {id}.",
    ),
}
NO_ID_TEMPLATES = {
    "refund": (
        "I want a refund for my last order.",
        "Can I get a refund? The thing I bought doesn't work.",
        "Please refund my purchase, I'm not happy with it.",
        "I need my money back for an order I made last week.",
    ),
    "status": (
        "Where is my order? It's been two weeks.",
        "My delivery never showed up.",
        "Can you check on my order? I don't have the number handy.",
    ),
    "damaged": (
        "My order arrived broken and I want a refund.",
        "The delivery came damaged, what now?",
    ),
    "wrong_item": (
        "I received the wrong size in my order.",
        "My order had the wrong item in it.",
    ),
    "double_charge": (
        "I was charged twice for the same purchase.",
        "There's a duplicate charge on my card from your store.",
    ),
    "cancel": (
        "I want to cancel my order.",
        "Please cancel the order I placed this morning and refund me.",
    ),
    "return": (
        "How do I return something I bought?",
        "I'd like to return my order, it doesn't fit.",
    ),
}
# off-topic asks avoid every domain word the environment reads (order, refund, ...)
OFF_TOPIC_TEMPLATES = {
    "store_hours": ("What time does your shop open on Sundays?", "Are you open on holidays?"),
    "product": (
        "Do you sell gift cards?",
        "Is the green jacket available in size M?",
        "Which of your coffee makers is the quietest?",
    ),
    "chit_chat": (
        "What's the weather like where you are?",
        "Tell me a joke.",
        "How are you today?",
    ),
    "writing": ("Can you write a short poem about cats?", "Help me write a birthday message."),
    "account": ("How do I change my password?", "Can I update my email address?"),
    "other": (
        "What is the capital of Australia?",
        "Do you have a newsletter I can sign up for?",
        "Can you recommend a good book?",
    ),
}

# how a customer may spell order 4017; every form normalises to ORD-4017
ID_SPELLINGS = (
    "ORD-{n}",
    "ORD-{n}",
    "ORD-{n}",
    "ord-{n}",
    "ORD{n}",
    "ord_{n}",
    "ord {n}",
    "#ORD-{n}",
)


def _draw_category(rng: random.Random,
                   shares: tuple[tuple[str, float], ...] = CATEGORY_SHARES) -> str:
    """One category, drawn with ``shares`` (one ``rng.random()`` call)."""
    draw = rng.random()
    for name, share in shares:
        if draw < share:
            return name
        draw -= share
    return shares[-1][0]


def _order_id_text(rng: random.Random) -> str:
    # 3-5 digits; most ids are 4 digits like the recipe's ORD-4017
    digits = rng.choice((3, 4, 4, 4, 4, 5))
    number = rng.randrange(10 ** (digits - 1), 10**digits)
    return rng.choice(ID_SPELLINGS).format(n=number)


def _dress(body: str, tone: str, kind: str | None, rng: random.Random) -> str:
    """Wrap a template sentence in a tone's opener/closer and maybe a customer-kind line."""
    opener = rng.choice(TONE_OPENERS[tone])
    if opener.endswith(("but", ",")) and not body.startswith(("I ", "I'", "{", "ORD", "#")):
        body = body[0].lower() + body[1:]  # "Hi there, can you..." reads as one sentence
    parts = [opener, body]
    if kind is not None:
        parts.append(CUSTOMER_KINDS[kind][rng.randrange(len(CUSTOMER_KINDS[kind]))])
    parts.append(rng.choice(TONE_CLOSERS[tone]))
    return join_message(parts, tone, kind)


def join_message(parts: list[str], tone: str, kind: str | None) -> str:
    """The non-empty parts joined; a curt customer drops the final stop, a typo-prone
    one writes in lower case (shared with the holdout grammar)."""
    text = " ".join(part for part in parts if part)
    if tone == "curt":
        text = text.rstrip(".!")
    if kind == "typo_prone":
        text = text.lower()
    return text


def _situation(index: int, seed: int, rng: random.Random) -> dict[str, Any]:
    wanted = _draw_category(rng)
    tone = rng.choice(sorted(TONE_OPENERS))
    kind = rng.choice(sorted(CUSTOMER_KINDS)) if rng.random() < 0.5 else None
    if wanted == "off_topic":
        intent = rng.choice(sorted(OFF_TOPIC_TEMPLATES))
        templates, order_text = OFF_TOPIC_TEMPLATES[intent], None
    elif wanted == "no_id":
        intent = rng.choice(sorted(NO_ID_TEMPLATES))
        templates, order_text = NO_ID_TEMPLATES[intent], None
    else:
        intent = rng.choice(sorted(WITH_ID_TEMPLATES))
        templates, order_text = WITH_ID_TEMPLATES[intent], _order_id_text(rng)
    key = json.dumps([seed, index, wanted, intent, tone, kind, order_text])
    scenario_id = "sc-" + hashlib.sha256(key.encode()).hexdigest()[:10]
    return {
        "scenario_id": scenario_id,
        "wanted": wanted,
        "intent": intent,
        "tone": tone,
        "kind": kind,
        "templates": templates,
        "order_text": order_text,
    }


def _phrasings(situation: dict[str, Any], rng: random.Random) -> list[tuple[str, str]]:
    """(template, prompt) pairs for one situation: one phrasing, sometimes two."""
    count = 2 if rng.random() < SECOND_PHRASING_SHARE else 1
    templates = situation["templates"]
    first = rng.randrange(len(templates))
    picks = [first] if count == 1 or len(templates) == 1 else [first, (first + 1) % len(templates)]
    out = []
    for pick in picks:
        template = templates[pick]
        body = template.format(id=situation["order_text"]) if situation["order_text"] else template
        out.append((template, _dress(body, situation["tone"], situation["kind"], rng)))
    return out


def simulate(n_situations: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Write prompt records for ``n_situations`` template situations.

    Returns a list of ``{"prompt", "scenario_id", "category", "case", "seed"}``
    in generation order, duplicates dropped. ``category`` and ``case`` are read
    back from the text by the refund environment; a phrasing that would not read
    as its situation's category is dropped (cannot happen with the shipped
    templates; a test checks). Raises ``ValueError`` for ``n_situations < 1``.
    """
    if n_situations < 1:
        raise ValueError(f"n_situations must be at least 1, got {n_situations}")
    rng = random.Random(seed)
    seen: set[str] = set()
    records: list[dict[str, Any]] = []
    for index in range(n_situations):
        situation = _situation(index, seed, rng)
        for template, prompt in _phrasings(situation, rng):
            case = case_for(prompt)
            if category(case) != situation["wanted"]:
                continue
            key = folded(prompt)
            if key in seen:
                continue
            seen.add(key)
            records.append(
                {
                    "prompt": prompt,
                    "scenario_id": situation["scenario_id"],
                    "category": category(case),
                    "case": case,
                    "seed": template,
                }
            )
    return records
