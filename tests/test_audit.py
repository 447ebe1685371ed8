"""The reward audit: per category, what the reward pays for beyond the environment's design."""

from __future__ import annotations

import random

from posttrain.envs import get_env, rewarded_features
from posttrain.score.audit import reward_audit

REFUND = get_env("refund")
ASKS = ("Could you tell me your order number?", "What is your order id?")
DEFLECTS = ("Sorry, I can only help with orders and refunds.", "I can't help with that.")


def lookup(order_id: str) -> str:
    return f'<tool_call>\n{{"name": "lookup_order", "arguments": {{"order_id": "{order_id}"}}}}' \
        "\n</tool_call>"


def refund_rows(score, seed: int = 0, scenarios: int = 30, samples: int = 8) -> list[dict]:
    """No-id scenarios answered by asking, deflecting or an invented lookup, scored by
    ``score(reply, case)``."""
    rng = random.Random(seed)
    rows = []
    for index in range(scenarios):
        prompt = f"My parcel number {index} never arrived, where is my order?"
        case = REFUND.case_for(prompt)
        for _ in range(samples):
            reply = rng.choice([*ASKS, *DEFLECTS, lookup(f"ORD-{rng.randrange(1000, 9999)}")])
            rows.append({"prompt": prompt, "scenario_id": f"s{index}", "category": "no_id",
                         "reply": reply, "score": score(reply, case)})
    return rows


def endorsed(category: str) -> tuple[str, ...]:
    return rewarded_features(REFUND, category)


def test_the_refund_rule_pays_for_nothing_beyond_its_design_on_no_id_prompts():
    audit = reward_audit(refund_rows(REFUND.score), endorsed)
    assert audit.findings == []
    assert audit.scanned == {"no_id": 240}
    assert "nothing beyond the design" in audit.format()


def test_a_reward_that_pays_for_invented_lookups_is_a_finding():
    def pays_for_calls(reply: str, case: dict) -> float:
        return 1.0 if "<tool_call>" in reply else REFUND.score(reply, case)

    audit = reward_audit(refund_rows(pays_for_calls), endorsed)
    features = {(finding.category, finding.feature) for finding in audit.findings}
    # the lookup, or one of its aliases, is what the reward pays for here
    assert ("no_id", "tool_call") in features or ("no_id", "tool:lookup_order") in features
    assert all(finding.direction == "+" for finding in audit.findings)
    assert "no_id: the reward pays for more" in audit.format()


def test_small_or_constant_categories_are_named_as_not_scanned():
    rows = refund_rows(REFUND.score, scenarios=2, samples=4)
    audit = reward_audit(rows, endorsed)
    assert audit.scanned == {} and "fewer than 20" in audit.skipped["no_id"]
    constant = [{**row, "score": 1.0} for row in refund_rows(REFUND.score)]
    assert "never varies" in reward_audit(constant, endorsed).skipped["no_id"]


def test_the_refund_design_is_declared_per_category():
    assert "has_question" in endorsed("no_id")
    assert "tool:lookup_order" in endorsed("with_id") and "tool:lookup_order" not in endorsed(
        "no_id"
    )
    assert "marker:well_formed" in endorsed("off_topic")  # the "*" entry applies everywhere
