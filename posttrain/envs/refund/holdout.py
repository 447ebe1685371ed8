"""The shipped refund holdout: a richer grammar than the template writer, filtered.

The template writer (``prompts.py``) says each ask in one of a few fixed sentences, so a
holdout cut from it is small (75 scenarios at the default 400 situations) and
phrased like the train side. This grammar composes a message from independent slots
that the template writer does not have, each drawn separately:

- a greeting (tone), a context sentence (what was bought and when: 30 products,
  12 times), an ask in one of 11 intents (2-6 phrasings each, none of them a template
  sentence), an optional detail sentence, an optional customer-kind line, a sign-off;
- for an order intent with an id, where the id sits: inside the ask, or in a reference
  line before or after it ("Order ref: ORD-4017.", "(order #ORD-4017)"), in any of the
  spellings the rule reads;
- off-topic asks (24, none with a domain word) with their own context lines.

Each situation gives one message, so every prompt is its own scenario (the unit the
intervals are drawn over). Every message then passes the two filters a model-written
set passes (``posttrain prompts write``): the **category filter** (the rule must read
back the situation's category, and for an id the exact id) and the **near-duplicate
filter** (word-set Jaccard >= 0.8 with an earlier kept message); a third filter drops a
message that close to any prompt the template writer can produce for the default data
seeds, so the holdout does not test phrasings the train side saw.

``build_holdout(situations, seed)`` returns the kept records and the filter counts;
``python -m posttrain.envs.refund.holdout OUT`` writes the shipped file, and a test
checks the shipped file is exactly what the function builds. Reproducible as the
template writer is: only ``random.Random(seed)`` draws and SHA-256 ids.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.envs.refund.prompts import (
    CATEGORY_SHARES,
    CUSTOMER_KINDS,
    ID_SPELLINGS,
    _draw_category,
    join_message,
    simulate,
)
from posttrain.envs.refund.rule import CATEGORIES, case_for, category, normalize_order_id
from posttrain.jsonl import write_jsonl_atomic
from posttrain.text import jaccard, word_set

#: the shipped set: its name for ``--holdout-set`` and how it was built
NAME = "refund-holdout"
SHIPPED_FILE = Path(__file__).with_name("data") / f"{NAME}.jsonl"
SITUATIONS = 480
SEED = 20261202
NEAR_DUPLICATE_JACCARD = 0.8
# the template writer's prompts the third filter compares against: data seeds 0-4 at the
# default 400 situations (the seeds the docs and tests train on), plus a wide sweep of
# seed 0 so every template sentence with every opener and closer is in the pool
TEMPLATE_POOL = ((400, 0), (400, 1), (400, 2), (400, 3), (400, 4), (3000, 0))

GREETINGS = {
    "polite": ("Hello there.", "Dear support team,", "Good afternoon.", "Hi team,",
               "Greetings,", ""),
    "curt": ("", "", "Support:"),
    "angry": ("I am fed up.", "Honestly, this is the last straw.", "What a mess.",
              "I can't believe this."),
    "confused": ("I hope this is the right place.", "Maybe you can help me.",
                 "I'm not sure how this works."),
    "chatty": ("Hey folks!", "Hi hi!", "Hello from a very long week,"),
}
SIGN_OFFS = {
    "polite": ("Kind regards, Sam", "Best wishes.", "Appreciate your help.", ""),
    "curt": ("", "Asap."),
    "angry": ("Sort it out.", "I expect an answer today.", "Not impressed.", ""),
    "confused": ("Thanks for your patience.", "Let me know what I should do.",
                 "Sorry for the trouble."),
    "chatty": ("You're the best!", "Thanks a million :)", "Talk soon!"),
}
PRODUCTS = (
    "a table lamp", "a blender", "a pair of hiking boots", "a phone case", "a desk chair",
    "a backpack", "a rain jacket", "an electric kettle", "wireless headphones",
    "a board game", "a set of towels", "a yoga mat", "a winter coat", "a coffee grinder",
    "two t-shirts", "a standing mirror", "a toaster", "running shoes", "a wall clock",
    "a baby monitor", "a watercolour set", "a camping tent", "a wool scarf", "a laptop sleeve",
    "garden gloves", "a bluetooth speaker", "a cast iron pan", "a kids' bike helmet",
    "a pack of light bulbs", "a leather belt",
)
WHEN = ("on Monday", "last week", "three days ago", "before the holidays", "yesterday",
        "at the start of the month", "for my sister's birthday", "during your sale",
        "about ten days ago", "on Friday night", "a fortnight ago", "this morning")
CONTEXT = (
    "I bought {product} from you {when}.",
    "{When_cap} I picked up {product} on your site.",
    "I got {product} {when}.",
    "A while back ({when}) I paid for {product}.",
    "So I purchased {product} {when}.",
    "My partner ordered {product} {when} using my account.",
)
# order asks: {ref} is "it", "my order" or the id in the sentence, chosen per message
ASKS = {
    "refund": (
        "I would like my money returned for {ref}.",
        "Could you put the money for {ref} back on my card?",
        "I'm asking for a full reimbursement on {ref}.",
        "Is it possible to be reimbursed for {ref}?",
        "Please process a refund on {ref} as soon as you can.",
        "Money back for {ref}, please.",
    ),
    "status": (
        "Any news on when {ref} will turn up?",
        "Tracking for {ref} hasn't moved in days.",
        "Can somebody tell me where {ref} is right now?",
        "{Ref_cap} was supposed to be here by now.",
        "The courier says {ref} is lost, is that true?",
    ),
    "damaged": (
        "{Ref_cap} showed up cracked down the middle.",
        "When I opened {ref}, half of it was in pieces.",
        "{Ref_cap} came with a big dent and does not work.",
        "The parcel for {ref} was soaked and everything inside is ruined.",
        "{Ref_cap} is scratched all over, clearly damaged in transit.",
    ),
    "wrong_item": (
        "Inside {ref} I found a completely different product.",
        "{Ref_cap} contained a size I never picked.",
        "You shipped the wrong colour in {ref}.",
        "What arrived in {ref} is not what I paid for.",
        "{Ref_cap} came with somebody else's item.",
    ),
    "double_charge": (
        "My bank shows I paid twice for {ref}.",
        "There are two identical debits for {ref} on my statement.",
        "I think you took the money for {ref} two times.",
        "The card was billed double for {ref}.",
    ),
    "cancel": (
        "I'd like to cancel {ref} before it leaves the warehouse.",
        "Please stop {ref}, I don't need it anymore.",
        "Can {ref} still be called off and the money returned?",
        "Cancel {ref}, I found it cheaper elsewhere.",
    ),
    "return": (
        "What do I do to send back {ref}?",
        "I'd like to send {ref} back for my money.",
        "How long do I have to return {ref}?",
        "Can I drop off {ref} at one of your shops to return it?",
    ),
    "missing_item": (
        "{Ref_cap} arrived with one item missing from the box.",
        "Only half of {ref} was delivered.",
        "The charger that should come with {ref} wasn't there.",
    ),
    "price_drop": (
        "{Ref_cap} is now on sale for less, can I get the difference refunded?",
        "The price of {ref} dropped the day after I paid, any chance of a partial refund?",
    ),
    "address": (
        "Can the delivery address for {ref} still be changed?",
        "I moved house, please ship {ref} to my new place.",
        "{Ref_cap} is going to my old address, can you fix that?",
    ),
    "warranty": (
        "{Ref_cap} stopped working after a month, is it under warranty?",
        "Does the guarantee cover {ref}? It broke already.",
        "{Ref_cap} died after three weeks, I want it replaced or refunded.",
    ),
}
# how a message points at the order when the id is not in the ask
NO_ID_REFS = ("my order", "my purchase", "what I ordered", "the item I ordered", "my last order")
ID_IN_ASK_REFS = ("order {id}", "{id}", "my order {id}", "order number {id}", "purchase {id}")
ID_LINES_BEFORE = ("Order ref: {id}.", "Re: {id}", "Reference {id} -", "About order {id}:")
ID_LINES_AFTER = ("(order {id})", "Order number: {id}.", "The order is {id}.",
                  "My reference is {id}.", "It's order {id} by the way.")
ID_PLACES = ("ask", "ask", "before", "after")
# said with an id or without one; order words that make a no-id message in domain
DETAILS = (
    "I have photos if you need them.",
    "I've been a customer for years.",
    "This is the first time something like this happened.",
    "I already tried the chat, nobody answered.",
    "The box is still sealed.",
    "I kept the receipt.",
    "",
    "",
)
# off-topic asks: none with a word the rule reads as a domain word (order, refund, ...)
OFF_TOPIC_ASKS = (
    "Do you have a shop in Lisbon?",
    "Is there parking near your store on High Street?",
    "Do you offer a student discount?",
    "Can you translate 'thank you very much' into French?",
    "What's a good name for a golden retriever puppy?",
    "Are your candles made with soy wax?",
    "Do you run workshops for kids in the summer?",
    "Could you suggest a gift for a ten year old who likes space?",
    "What is the difference between a latte and a flat white?",
    "Is your website available in Spanish?",
    "How do I unsubscribe from your text messages?",
    "Can I bring my dog into your store?",
    "Do you have any jobs going at the moment?",
    "What's the best way to clean suede?",
    "Who designs your furniture range?",
    "Can you give me a recipe for banana bread?",
    "Is it true you are opening a cafe?",
    "How many planets are in the solar system?",
    "Can you recommend a podcast for a long drive?",
    "Do your lamps come with bulbs included?",
    "Which umbrella would survive a storm?",
    "Can I book a personal shopping appointment?",
    "What's your opinion on pineapple on pizza?",
    "Do you sponsor local football teams?",
)
OFF_TOPIC_CONTEXT = (
    "I'm planning a party next weekend.",
    "My friend recommended your store.",
    "Quick question before I visit.",
    "Random one, sorry.",
    "I saw your advert on the bus.",
    "",
    "",
)


@dataclass
class HoldoutReport:
    """How many messages the grammar wrote and what each filter dropped."""

    written: int = 0
    dropped_category: int = 0
    dropped_ground_truth: int = 0
    dropped_near_duplicate: int = 0
    dropped_near_template: int = 0
    kept: int = 0
    by_category: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        per_category = ", ".join(f"{name} {count}" for name, count in self.by_category.items())
        return [
            f"written {self.written}, kept {self.kept} ({per_category})",
            f"dropped: category {self.dropped_category}, ground truth "
            f"{self.dropped_ground_truth}, near duplicate {self.dropped_near_duplicate}, "
            f"near a template prompt {self.dropped_near_template}",
        ]


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _id_text(rng: random.Random) -> str:
    # 3-5 digits in the spellings the rule reads, like the template writer's ids
    digits = rng.choice((3, 4, 4, 4, 5))
    return rng.choice(ID_SPELLINGS).format(n=rng.randrange(10 ** (digits - 1), 10**digits))


def _fill_ask(template: str, ref: str) -> str:
    return template.replace("{Ref_cap}", _capitalised(ref)).replace("{ref}", ref)


def _order_message(wanted: str, intent: str, rng: random.Random) -> tuple[str, str | None]:
    """The body of an order message and the id text it names (None without one)."""
    product = rng.choice(PRODUCTS)
    when = rng.choice(WHEN)
    context = rng.choice(CONTEXT).format(product=product, when=when,
                                         When_cap=_capitalised(when))
    ask = rng.choice(ASKS[intent])
    sentences = [context] if rng.random() < 0.7 else []
    id_text = _id_text(rng) if wanted == "with_id" else None
    if id_text is None:
        sentences.append(_fill_ask(ask, rng.choice(NO_ID_REFS)))
    else:
        place = rng.choice(ID_PLACES)
        if place == "ask":
            sentences.append(_fill_ask(ask, rng.choice(ID_IN_ASK_REFS).format(id=id_text)))
        else:
            ask_text = _fill_ask(ask, rng.choice(("it", "my order", "the order")))
            line = rng.choice(ID_LINES_BEFORE if place == "before" else ID_LINES_AFTER)
            pair = [line.format(id=id_text), ask_text]
            sentences.extend(pair if place == "before" else pair[::-1])
    sentences.append(rng.choice(DETAILS))
    return " ".join(part for part in sentences if part), id_text


def _dress(body: str, tone: str, kind: str | None, rng: random.Random) -> str:
    parts = [rng.choice(GREETINGS[tone]), body]
    if kind is not None:
        parts.append(rng.choice(CUSTOMER_KINDS[kind]))
    parts.append(rng.choice(SIGN_OFFS[tone]))
    return join_message(parts, tone, kind)


def _situation(index: int, seed: int, rng: random.Random) -> dict[str, Any]:
    wanted = _draw_category(rng, CATEGORY_SHARES)
    tone = rng.choice(sorted(GREETINGS))
    kind = rng.choice(sorted(CUSTOMER_KINDS)) if rng.random() < 0.4 else None
    if wanted == "off_topic":
        intent = "off_topic"
        body = " ".join(part for part in (rng.choice(OFF_TOPIC_CONTEXT),
                                          rng.choice(OFF_TOPIC_ASKS)) if part)
        id_text = None
    else:
        intent = rng.choice(sorted(ASKS))
        body, id_text = _order_message(wanted, intent, rng)
    text = _dress(body, tone, kind, rng)
    key = json.dumps([seed, index, wanted, intent, tone, kind, text])
    return {
        "scenario_id": "hx-" + hashlib.sha256(key.encode()).hexdigest()[:10],
        "wanted": wanted,
        "intent": intent,
        "id_text": id_text,
        "prompt": text,
    }


@functools.cache
def template_pool() -> tuple[frozenset[str], ...]:
    """Word sets of every prompt the template writer writes for ``TEMPLATE_POOL`` (computed
    once a process: about 6,500 template prompts, seconds to write)."""
    seen: dict[str, frozenset[str]] = {}
    for situations, seed in TEMPLATE_POOL:
        for record in simulate(situations, seed):
            seen.setdefault(record["prompt"], word_set(record["prompt"]))
    return tuple(seen.values())


def build_holdout(situations: int = SITUATIONS, seed: int = SEED
                  ) -> tuple[list[dict[str, Any]], HoldoutReport]:
    """Write ``situations`` messages and keep those that pass the filters (module docstring).

    Records are ``{"prompt", "scenario_id", "category", "case", "seed", "source"}`` where
    ``seed`` names the intent and ``source`` is ``"grammar"``.
    """
    if situations < 1:
        raise ValueError(f"situations must be at least 1, got {situations}")
    rng = random.Random(seed)
    report = HoldoutReport()
    pool = template_pool()
    kept: list[dict[str, Any]] = []
    kept_words: list[frozenset[str]] = []
    for index in range(situations):
        situation = _situation(index, seed, rng)
        report.written += 1
        case = case_for(situation["prompt"])
        record = {"prompt": situation["prompt"], "scenario_id": situation["scenario_id"],
                  "category": category(case), "case": case, "seed": situation["intent"]}
        if record["category"] != situation["wanted"]:
            report.dropped_category += 1
            continue
        wanted_id = normalize_order_id(situation["id_text"] or "")
        if record["case"]["order_id"] != wanted_id:
            report.dropped_ground_truth += 1
            continue
        words = word_set(record["prompt"])
        if any(jaccard(words, other) >= NEAR_DUPLICATE_JACCARD for other in kept_words):
            report.dropped_near_duplicate += 1
            continue
        if any(jaccard(words, other) >= NEAR_DUPLICATE_JACCARD for other in pool):
            report.dropped_near_template += 1
            continue
        kept.append({**record, "source": "grammar"})
        kept_words.append(words)
    report.kept = len(kept)
    counts = {name: sum(r["category"] == name for r in kept) for name in CATEGORIES}
    report.by_category = {name: count for name, count in counts.items() if count}
    return kept, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.envs.refund.holdout",
        description="Write the refund holdout set (the file shipped as "
        f"{NAME!r}) and print its filter counts.",
    )
    parser.add_argument("out", help="JSONL file to write (the shipped one: "
                        "posttrain/envs/refund/data/refund-holdout.jsonl)")
    parser.add_argument("--situations", type=int, default=SITUATIONS,
                        help=f"messages to write before filtering (default {SITUATIONS})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"grammar seed (default {SEED})")
    args = parser.parse_args(argv)
    records, report = build_holdout(args.situations, args.seed)
    write_jsonl_atomic(args.out, records)
    print("\n".join([f"wrote {args.out}", *report.lines()]))
    print(json.dumps(asdict(report), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
