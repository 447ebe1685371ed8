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
    # nothing scanned reads as such, not as an empty count ("reward audit ( rows; ...")
    assert audit.format().startswith("reward audit (no rows scanned; endorsed")
    constant = [{**row, "score": 1.0} for row in refund_rows(REFUND.score)]
    assert "never varies" in reward_audit(constant, endorsed).skipped["no_id"]


def test_the_refund_design_is_declared_per_category():
    assert "has_question" in endorsed("no_id")
    assert "tool:lookup_order" in endorsed("with_id") and "tool:lookup_order" not in endorsed(
        "no_id"
    )
    assert "marker:well_formed" in endorsed("off_topic")  # the "*" entry applies everywhere


def off_topic_rows(score, seed: int = 0, scenarios: int = 30, samples: int = 8) -> list[dict]:
    """Off-topic scenarios answered short or at length, scored by ``score(reply, case)``."""
    rng = random.Random(seed)
    rows = []
    for index in range(scenarios):
        prompt = f"What is the capital of country number {index}?"
        case = REFUND.case_for(prompt)
        for _ in range(samples):
            deflect = DEFLECTS[0]  # one wording: length is all that varies
            reply = deflect if rng.random() < 0.5 else " ".join([deflect] * rng.randrange(20, 30))
            rows.append({"prompt": prompt, "scenario_id": f"t{index}", "category": "off_topic",
                         "reply": reply, "score": score(reply, case)})
    return rows


def test_a_direction_the_design_pays_for_is_no_finding_and_the_other_one_is():
    assert "-length" in endorsed("off_topic")  # the rule pays for staying short
    assert reward_audit(off_topic_rows(REFUND.score), endorsed).findings == []

    def pays_for_length(reply: str, case: dict) -> float:
        return min(1.0, len(reply) / 500)

    findings = reward_audit(off_topic_rows(pays_for_length), endorsed).findings
    assert [(f.category, f.feature) for f in findings if f.feature == "length"] == [
        ("off_topic", "length")]


def test_declared_features_carry_the_direction_the_design_pays_in():
    from posttrain.envs.base import design_direction

    assert design_direction(endorsed("no_id"), "has_question") == "+"
    assert design_direction(endorsed("off_topic"), "length") == "-"
    assert design_direction(endorsed("with_id"), "has_question") == "~"
    assert design_direction(("lookup_order",), "tool:lookup_order") == "+"  # a bare tool name
    assert design_direction(endorsed("no_id"), "tool:lookup_order") is None


WORDS = ("that", "sorry", "the", "order", "please", "can", "help", "only", "desk", "you",
         "refund", "number", "check", "again", "today", "thanks")


def noise_rows(seed: int) -> list[dict]:
    """Three categories of replies built from frequent words, scored by a coin: whatever
    the audit finds in them is noise."""
    rng = random.Random(seed)
    rows = []
    for category in ("with_id", "no_id", "off_topic"):
        for index in range(12):
            for _ in range(6):
                reply = " ".join(rng.sample(WORDS, rng.randrange(3, 9))) + rng.choice(["", "?"])
                rows.append({"prompt": f"{category} {index}", "scenario_id": f"{category}{index}",
                             "category": category, "reply": reply,
                             "score": float(rng.random() < 0.5)})
    return rows


def test_findings_survive_their_number_and_the_audit_says_how_many_it_tested():
    """Issue #70, item 3: each category's scan held its own 5% (three categories, two
    families each; on an AVX2 CPU the audit printed `off_topic: 'word:that' +0.58 (noise
    floor 0.42)`). The 5% is now the whole audit's, split over every family it tests, and
    the audit says how many features it tested. On these coin-scored rows, 100 seeds: 13
    audits of 100 found noise before, 2 now."""
    audits = [reward_audit(noise_rows(seed), endorsed, seed=seed) for seed in range(20)]
    with_findings = sum(1 for audit in audits if audit.findings)
    assert with_findings <= 3, [audit.described() for audit in audits if audit.findings]
    first = audits[0]
    assert first.tested >= 3 * len(WORDS) // 2 and len(first.scanned) == 3
    assert f"{first.tested} features tested in 3 categories; a finding holds against noise " \
           "at 0.05 over all of them" in first.format()
    assert first.to_dict()["tested"] == first.tested
