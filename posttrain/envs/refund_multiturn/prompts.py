"""The multi-turn refund environment's prompt writer: refund requests, from templates.

The single-turn writer's customers also ask where a parcel is or how to return
something; here every order message asks for money back (a refund, a broken or
wrong item), so "refund it or say why not" is the right job for each. Tones,
customer kinds, id spellings and off-topic asks are the refund writer's. Whether an
order is refundable comes from the order book, so ``eligible`` and ``ineligible``
follow from the id drawn. Deterministic: ``random.Random(seed)`` and SHA-256 only.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from posttrain.envs.refund.prompts import (
    CUSTOMER_KINDS,
    NO_ID_TEMPLATES,
    OFF_TOPIC_TEMPLATES,
    TONE_OPENERS,
    WITH_ID_TEMPLATES,
    _draw_category,
    _dress,
    _order_id_text,
)
from posttrain.envs.refund_multiturn.rule import case_for, category

REFUND_INTENTS = ("refund", "damaged", "wrong_item")
# with an id 60% (eligible or not, by the book), no id 25%, off topic 15%
SHARES = (("with_id", 0.60), ("no_id", 0.25), ("off_topic", 0.15))


def write_prompts(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` prompt records ``{"prompt", "scenario_id", "category", "case", "seed"}``
    (fewer when two situations happen to write the same text: duplicates are dropped)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    seen: set[str] = set()
    records = []
    for index in range(count):
        wanted = _draw_category(rng, SHARES)
        tone = rng.choice(sorted(TONE_OPENERS))
        kind = rng.choice(sorted(CUSTOMER_KINDS)) if rng.random() < 0.5 else None
        if wanted == "off_topic":
            intent = rng.choice(sorted(OFF_TOPIC_TEMPLATES))
            template, order_text = rng.choice(OFF_TOPIC_TEMPLATES[intent]), None
        elif wanted == "no_id":
            intent = rng.choice(REFUND_INTENTS)
            template, order_text = rng.choice(NO_ID_TEMPLATES[intent]), None
        else:
            intent = rng.choice(REFUND_INTENTS)
            template, order_text = rng.choice(WITH_ID_TEMPLATES[intent]), _order_id_text(rng)
        body = template.format(id=order_text) if order_text else template
        prompt = _dress(body, tone, kind, rng)
        key = " ".join(prompt.lower().split())
        if key in seen:
            continue
        seen.add(key)
        case = case_for(prompt)
        situation = json.dumps([seed, index, wanted, intent, tone, kind, order_text])
        records.append({
            "prompt": prompt,
            "scenario_id": "mt-" + hashlib.sha256(situation.encode()).hexdigest()[:10],
            "category": category(case),
            "case": case,
            "seed": template,
        })
    return records
