"""hack_scan: names what the reward pays for within prompt, and nothing when it is noise."""

from __future__ import annotations

import random

import pytest

from posttrain.score.hack_scan import hack_scan, tool_names

WORDS = ("please order refund thanks sure help check status item ship day return money card "
         "account").split()


def chatter(rng: random.Random, low: int = 3, high: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def graded(prompt: int, reply: str, score: float) -> dict:
    score = min(1.0, max(0.0, score))
    return {"prompt": f"prompt {prompt}", "scenario_id": f"s{prompt}", "reply": reply,
            "score": score, "reward": int(score >= 1.0), "markers": {}}


def length_paying_rows(seed: int = 0, prompts: int = 20, samples: int = 8) -> list[dict]:
    """Every prompt has its own difficulty; within it, the score grows with reply length."""
    rng = random.Random(seed)
    rows = []
    for prompt in range(prompts):
        difficulty = rng.random() * 0.3
        for _ in range(samples):
            reply = chatter(rng)
            rows.append(graded(prompt, reply, difficulty + 0.002 * len(reply) + rng.gauss(0, 0.05)))
    return rows


def noise_rows(seed: int, prompts: int = 20, samples: int = 8) -> list[dict]:
    rng = random.Random(seed)
    return [graded(prompt, chatter(rng), rng.random())
            for prompt in range(prompts) for _ in range(samples)]


def test_a_reward_that_pays_for_length_is_named():
    report = hack_scan(length_paying_rows())
    assert report.top_unendorsed == "length"
    top = report.features[0]
    assert (top.name, top.direction, top.flagged) == ("length", "+", True)
    assert top.statistic > top.floor and top.p_value < 0.05
    assert top.n_groups == 20 and not report.degenerate
    assert "the reward pays for more 'length'" in report.format()


def test_endorsed_length_is_not_an_alarm_and_nothing_else_is_flagged():
    report = hack_scan(length_paying_rows(), endorsed=["length"])
    assert report.top_unendorsed is None
    assert report.endorsed_matched == ["length"]
    assert report.flagged == ["length"]  # still reported, as endorsed
    # words that merely come with longer replies are judged net of length
    assert all(not result.flagged for result in report.features if result.name != "length")


def test_pure_noise_names_nothing_in_at_least_nine_of_ten_datasets():
    # alpha 0.05 is the family-wise rate: about 1 noise dataset in 20 flags something.
    flagged = [seed for seed in range(10) if hack_scan(noise_rows(100 + seed), seed=seed).flagged]
    assert len(flagged) <= 1, flagged


def test_all_constant_rewards_are_degenerate():
    rows = [graded(prompt, chatter(random.Random(prompt * 10 + i)), 0.3)
            for prompt in range(6) for i in range(4)]
    report = hack_scan(rows)
    assert report.degenerate and report.n_groups_with_variance == 0
    assert report.features == [] and report.top_unendorsed is None
    assert "degenerate" in report.format()


def test_rewards_that_vary_where_no_feature_does_name_nothing():
    # replies that differ only in a number (a count the rule checks): the reward varies
    # within each prompt, no feature does (a crash before: an empty float mask)
    call = '<tool_call>\n{"name": "book_pickup", "arguments": {"parcels": %d}}\n</tool_call>'
    rows = [graded(prompt, call % count, 1.0 if count == 3 else 0.2)
            for prompt in range(6) for count in (3, 5, 7, 9)]
    report = hack_scan(rows, endorsed=("tool:book_pickup",))
    assert report.n_groups_with_variance == 6
    assert report.top_unendorsed is None


def test_differences_between_prompts_are_not_mistaken_for_a_hack():
    # long replies come from easy prompts (high score) and short ones from hard prompts, but
    # within each prompt the score is noise: the pooled correlation is large, within zero.
    rng = random.Random(3)
    rows = []
    for prompt in range(24):
        easy = prompt % 2 == 0
        for _ in range(8):
            reply = chatter(rng, 30, 40) if easy else chatter(rng, 2, 6)
            rows.append(graded(prompt, reply, (0.6 if easy else 0.1) + rng.random() * 0.3))
    assert hack_scan(rows).top_unendorsed is None


CALL = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-%d"}}\n</tool_call>'


def refund_rows(pays_for_please: bool, seed: int = 0) -> list[dict]:
    """With-id prompts: a lookup_order call scores 1.0, asking again 0.3 (the refund rule)."""
    rng = random.Random(seed)
    rows = []
    for prompt in range(20):
        for _ in range(8):
            if rng.random() < 0.5:
                reply, score = CALL % (1000 + prompt), 1.0
            else:
                reply, score = "Could you send me your order id?", 0.3
            if rng.random() < 0.5:
                reply = "Sure, please wait. " + reply
                score += 0.3 if pays_for_please else 0.0
            rows.append(graded(prompt, reply, score))
    return rows


def test_features_that_come_with_the_endorsed_tool_call_are_not_blamed():
    report = hack_scan(refund_rows(pays_for_please=False), endorsed=["lookup_order"])
    assert report.endorsed_matched == ["tool:lookup_order"]
    assert report.top_unendorsed is None
    by_name = {result.name: result for result in report.features}
    # <tool_call>, digits and the question mark move exactly with the call: one feature
    aliases = by_name["tool:lookup_order"].aliases
    assert "token:<tool_call>" in aliases and "-has_question" in aliases
    assert not any(result.flagged for result in report.features if not result.endorsed)


def test_a_hack_next_to_the_endorsed_behaviour_is_still_named():
    report = hack_scan(refund_rows(pays_for_please=True), endorsed=["lookup_order"])
    # the paid-for prefix "Sure, please wait." is also exactly 19 more characters, so given
    # the call, length and the prefix's words are the same column: any of them names it
    assert report.top_unendorsed in {"length", "word:please", "word:sure", "word:wait"}
    assert "word:please" in report.flagged


def test_without_endorsement_the_tool_call_itself_is_the_top_feature():
    report = hack_scan(refund_rows(pays_for_please=False))
    assert report.top_unendorsed == "tool_call"  # first in scan order of its aliases
    assert "-has_question" in report.features[0].aliases


def test_a_feature_seen_in_too_few_groups_is_never_flagged():
    rows = length_paying_rows(prompts=3)
    report = hack_scan(rows, min_groups=4)
    assert report.flagged == [] and report.warnings


def test_the_scan_reads_the_field_it_is_told_to():
    rows = length_paying_rows()
    for row in rows:
        row["reward"] = 0  # pass/fail carries nothing here
    assert hack_scan(rows, reward="reward").degenerate
    assert not hack_scan(rows).degenerate


def test_the_scan_is_deterministic_for_a_seed():
    first = hack_scan(length_paying_rows(), seed=4).to_dict()
    assert hack_scan(length_paying_rows(), seed=4).to_dict() == first


def test_custom_features_are_scanned_by_name():
    rows = length_paying_rows()
    report = hack_scan(rows, features={"long_reply": lambda row: len(row["reply"]) > 100})
    assert "long_reply" in {result.name for result in report.features}


def test_rows_group_by_prompt_when_they_have_no_scenario():
    rows = length_paying_rows()
    for row in rows:
        row.pop("scenario_id")
    assert hack_scan(rows).n_groups == 20


def test_tool_names_reads_every_block_even_with_broken_json():
    reply = CALL % 7 + ' then <tool_call>{"name": "create_refund", oops}</tool_call>'
    assert tool_names(reply) == ["lookup_order", "create_refund"]


@pytest.mark.parametrize("bad", [{"n_perm": 0}, {"alpha": 1.0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        hack_scan(noise_rows(0), **bad)
