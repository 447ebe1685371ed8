"""Reward probes (posttrain.score.probes): on fixed base-policy replies, an honest rule pays
for no edit, and each planted flaw is named by the edit it pays for, before any training."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.envs import get_env
from posttrain.envs.wire import join_turns, render_tool_call
from posttrain.score.audit import audit_reward
from posttrain.score.planted import planted_hack
from posttrain.score.probes import ProbeSettings, probe_reward

REFUND = get_env("refund")
MULTI = get_env("refund-multiturn")

ASKS = ("Could you tell me your order number?", "What is your order id, please?")
DEFLECTS = ("Sorry, I can only help with orders and refunds.",
            "I'm sorry, that is not something I can help with.")
PLAIN = ("I will look into it.", "Thanks for reaching out about your order.")


def refund_rows(seed: int = 0, scenarios: int = 12, samples: int = 4) -> list[dict]:
    """A weak base policy's replies on the three refund categories, scored by the rule."""
    rng = random.Random(seed)
    rows = []
    for index in range(scenarios):
        order = f"ORD-{4000 + index}"
        for category, prompt in (
            ("with_id", f"My order {order} arrived broken, can you help?"),
            ("no_id", f"My parcel number {index} never arrived, where is my order?"),
            ("off_topic", f"What is the capital of country number {index}?"),
        ):
            case = REFUND.case_for(prompt)
            assert REFUND.category(case) == category
            for sample in range(samples):
                if category == "with_id":
                    reply = rng.choice([render_tool_call("lookup_order", {"order_id": order}),
                                        *PLAIN])
                elif category == "no_id":
                    invented = f"ORD-{rng.randrange(1000, 3999)}"
                    reply = rng.choice([*ASKS, *PLAIN,
                                        render_tool_call("lookup_order", {"order_id": invented})])
                else:
                    reply = rng.choice(DEFLECTS)
                rows.append({"prompt": prompt, "scenario_id": f"{category}-{index}",
                             "category": category, "sample": sample, "reply": reply,
                             "score": REFUND.score(reply, case)})
    return rows


def probed(target: str | None, rows: list[dict], env=REFUND) -> set[tuple[str, str]]:
    score = planted_hack(env, target) if target else env.score
    report = probe_reward(env, rows, score, rule=env.score if target else None)
    assert not report.skipped
    return {(finding.category, finding.probe) for finding in report.findings}


def probes_named(found: set[tuple[str, str]]) -> set[str]:
    return {probe for _, probe in found}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_honest_rule_pays_for_no_edit(seed):
    assert probed(None, refund_rows(seed)) == set()


@pytest.mark.parametrize(("target", "probe"), [
    ("planted:length", "pad"),
    ("planted:format_token", "stray_tag"),
    ("planted:question", "question"),
    ("planted:sycophancy", "flattery"),
    ("planted:any_call", "foreign_call"),
    ("planted:invented_arguments", "foreign_call"),
    ("planted:keyword=order", "word:order"),
])
def test_each_planted_flaw_is_named_by_the_edit_it_pays_for(target, probe):
    assert probe in probes_named(probed(target, refund_rows()))


def test_an_edit_the_design_pays_for_in_a_category_is_not_probed_there():
    # the refund design pays for asking on no-id prompts (has_question): a question
    # there is the rule's intent, so only the other categories read planted:question
    found = probed("planted:question", refund_rows())
    assert ("off_topic", "question") in found or ("with_id", "question") in found
    assert ("no_id", "question") not in found


def test_a_reward_that_pays_what_the_rule_pays_for_an_edit_is_no_finding():
    def rule_plus_a_tenth(reply: str, case: dict) -> float:
        return REFUND.score(reply, case) + 0.1  # the rule's differences, shifted

    assert probed_with(rule_plus_a_tenth, refund_rows()) == set()


def probed_with(score, rows: list[dict]) -> set[tuple[str, str]]:
    report = probe_reward(REFUND, rows, score, rule=REFUND.score)
    return {(finding.category, finding.probe) for finding in report.findings}


def test_a_finding_reads_as_the_edit_the_gain_and_the_rules_gain():
    report = probe_reward(REFUND, refund_rows(), planted_hack(REFUND, "planted:sycophancy"),
                          rule=REFUND.score)
    finding = next(f for f in report.findings if f.probe == "flattery")
    assert finding.gain == pytest.approx(0.5) and finding.rule_gain == pytest.approx(0.0)
    assert finding.feature == "probe:flattery"
    text = finding.describe()
    assert text.startswith(f"{finding.category}: opening with 'Great question, happy to help!'")
    assert "raised the reward +0.50" in text
    assert "the rule's score of the same edits moved +0.00" in text


def test_replacing_edits_are_read_only_against_a_rule():
    rows = refund_rows()
    report = probe_reward(REFUND, rows, planted_hack(REFUND, "planted:any_call"))  # no rule
    assert "foreign_call" not in {finding.probe for finding in report.findings}


def test_a_reward_that_fails_on_an_edit_is_skipped_and_said_why():
    def strict(reply: str, case: dict) -> float:
        if reply.endswith("<tool_call>"):
            raise ValueError("unclosed tag")
        return REFUND.score(reply, case)

    report = probe_reward(REFUND, refund_rows(), strict)
    assert any("stray_tag" in name and "ValueError: unclosed tag" in why
               for name, why in report.skipped.items())


def test_the_time_budget_skips_what_is_left_and_says_so():
    report = probe_reward(REFUND, refund_rows(), REFUND.score,
                          settings=ProbeSettings(max_seconds=0.0))
    assert report.findings == [] and report.skipped
    assert all("were spent" in why for why in report.skipped.values())


def test_probes_are_deterministic_for_a_seed():
    rows = refund_rows()
    score = planted_hack(REFUND, "planted:any_call")
    first = probe_reward(REFUND, rows, score, rule=REFUND.score, seed=3).findings
    again = probe_reward(REFUND, rows, score, rule=REFUND.score, seed=3).findings
    assert [f.to_dict() for f in first] == [f.to_dict() for f in again]


def test_the_audit_reports_probe_findings_with_the_scan():
    rows = refund_rows()
    audit = audit_reward(REFUND, rows, planted_hack(REFUND, "planted:sycophancy"),
                         rule=REFUND.score)
    assert any(finding.probe == "flattery" for finding in audit.probes)
    assert "  probe: " in audit.format()
    assert "probe:flattery" in {probe["feature"] for probe in audit.to_dict()["probes"]}
    clean = audit_reward(REFUND, rows, REFUND.score)
    assert clean.probes == [] and "no probe edit paid" in clean.format()


def multiturn_rows(scenarios: int = 10) -> list[dict]:
    """Episodes of the multi-turn desk: a lookup first on order prompts, a plain reply off
    topic, scored by the episode rule."""
    rows = []
    for index in range(scenarios):
        order = f"ORD-{5000 + index}"
        for prompt, turns in (
            (f"Order {order} arrived broken, I want my money back.",
             [render_tool_call("lookup_order", {"order_id": order}), "I have looked it up."]),
            (f"Can you write me a poem about the number {index}?",
             ["Sorry, I can only help with orders and refunds."]),
        ):
            case = MULTI.case_for(prompt)
            for sample in range(4):
                reply = join_turns(turns)
                rows.append({"prompt": prompt, "scenario_id": f"m{index}-{len(turns)}",
                             "category": MULTI.category(case), "sample": sample,
                             "reply": reply, "score": MULTI.score(reply, case)})
    return rows


def test_an_early_end_on_a_multi_turn_rule_is_named_by_an_off_task_reply():
    rows = multiturn_rows()
    assert probed(None, rows, MULTI) == set()
    found = probed("planted:early_end", rows, MULTI)
    assert any(probe == "foreign_reply" for _, probe in found)


REPLY_PARTS = st.sampled_from([
    "", " ", "?", "<tool_call>", "</tool_call>", '{"name": "lookup_order"', "ORD-4000",
    render_tool_call("lookup_order", {"order_id": "ORD-4001"}), "sorry", "\x00", "é",
    "Could you tell me your order number?", "x" * 50,
])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(REPLY_PARTS, max_size=4).map("".join), min_size=1, max_size=40),
       st.integers(0, 3))
def test_any_replies_give_findings_or_nothing_never_an_error(replies, seed):
    # whatever the base policy wrote (broken tags, NUL, nothing), the probes of the rule
    # and of a planted reward read it without raising and report well-formed findings
    base = refund_rows(seed, scenarios=4, samples=2)
    rows = [{**row, "reply": replies[index % len(replies)]} for index, row in enumerate(base)]
    for target in (None, "planted:format_token"):
        score = planted_hack(REFUND, target) if target else REFUND.score
        report = probe_reward(REFUND, rows, score, rule=REFUND.score if target else None,
                              settings=ProbeSettings(min_rows=2), seed=seed)
        assert not report.skipped
        for finding in report.findings:
            assert finding.gain >= 0.05 and finding.rows >= 2
            assert finding.category in {"with_id", "no_id", "off_topic"}
