"""Preference pairs: how replies are paired, constructed negatives, and the pairs file."""

from __future__ import annotations

import json

import pytest

from posttrain.envs.refund import REFUND_ENV, normalize_order_id, parse_tool_call
from posttrain.envs.refund.agent import Behaviour, seeded_agent
from posttrain.envs.refund.negatives import invented_call
from posttrain.errors import InputFileError
from posttrain.train.training_data.pairs import (
    PairReport,
    build_preference_pairs,
    constructed_negatives,
    export_preference,
    load_pairs,
    sample_pair_rows,
    side_text,
)

WITH_ID = "Please refund order ORD-4017, it arrived broken."
NO_ID = "I want a refund for my order, it never came."
OFF_TOPIC = "What is the capital of Australia?"
LOOKUP = (
    '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-4017"}}\n</tool_call>'
)
REFUND_FIRST = (
    '<tool_call>\n{"name": "create_refund", "arguments": {"order_id": "ORD-4017", '
    '"amount": 20}}\n</tool_call>'
)


def row(prompt: str, reply: str, score: float, scenario: str = "s1") -> dict:
    return {"prompt": prompt, "reply": reply, "score": score, "scenario_id": scenario}


def chosen_and_rejected(pairs: list[dict]) -> list[tuple[str, str]]:
    return [(side_text(p, "chosen"), side_text(p, "rejected")) for p in pairs]


# ---------------------------------------------------------------- sampled pairs


def test_the_rejected_reply_is_the_one_closest_in_length_to_the_chosen():
    rows = [
        row(NO_ID, "What is your order id?", 1.0),  # 22 characters
        row(NO_ID, "x" * 90, 0.2),
        row(NO_ID, "Okay, noted. Bye now.", 0.2),  # 21 characters: the closest
        row(NO_ID, "Refunded.", 0.2),
    ]
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert chosen_and_rejected(pairs) == [("What is your order id?", "Okay, noted. Bye now.")]


def test_without_length_matching_the_highest_scoring_candidate_is_rejected():
    rows = [
        row(WITH_ID, LOOKUP, 1.0),
        row(WITH_ID, "Refunded.", 0.0),
        row(WITH_ID, "Which order is it?", 0.3),
    ]
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows, length_match=False)
    assert chosen_and_rejected(pairs) == [(LOOKUP, "Which order is it?")]


def test_each_reply_joins_at_most_one_pair():
    # two passes, one fail: the fail can be rejected only once
    rows = [
        row(WITH_ID, LOOKUP, 1.0),
        row(WITH_ID, LOOKUP + " ", 1.0),
        row(WITH_ID, REFUND_FIRST, 0.2),
    ]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert len(pairs) == 1
    assert report.sampled_pairs == 1


def test_a_prompt_gives_at_most_max_pairs_per_prompt():
    rows = [row(NO_ID, f"What is the order id{'?' * n}", 1.0) for n in range(1, 4)]
    rows += [row(NO_ID, f"Noted{'.' * n}", 0.2) for n in range(1, 4)]
    assert len(build_preference_pairs(env=REFUND_ENV, rows=rows)[0]) == 2
    assert len(build_preference_pairs(env=REFUND_ENV, rows=rows, max_pairs_per_prompt=3)[0]) == 3


def test_a_gap_below_the_minimum_margin_is_no_pair():
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, "Which order is it?", 0.7)]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert pairs == []
    assert (report.prompts_seen, report.prompts_with_contrast) == (1, 0)
    assert any("--pair-samples" in warning for warning in report.warnings)


def test_a_near_miss_pairs_with_a_right_answer_on_the_raw_score():
    # 1.0 against 0.3: both "fail" as a 0/1 reward would be 1 vs 0 only for one of them;
    # the raw score keeps the 0.7 gap, which clears the 0.5 margin
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, "Which order is it?", 0.3)]
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert [p["margin"] for p in pairs] == [0.7]


def test_pairs_whose_first_turns_read_the_same_are_dropped_and_counted():
    # the same call (keys in another order) behind different prose, scored apart by a judge
    reordered = (
        'Sure! <tool_call>\n{"arguments": {"order_id": "ORD-4017"}, "name": "lookup_order"}'
        "\n</tool_call>"
    )
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, reordered, 0.2)]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert pairs == []
    assert report.identical_first_turns_dropped == 1
    assert report.prompts_with_contrast == 1


def test_prompts_group_by_text_whatever_the_case_and_spacing():
    rows = [
        row("Where is my order?", "What is the order id?", 1.0, scenario="a"),
        row("where  is my ORDER?", "Bye.", 0.2, scenario="b"),
    ]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert report.prompts_seen == 1
    assert len(pairs) == 1
    assert pairs[0]["scenario_id"] == "a"  # noted from the chosen reply's row


def test_a_pair_is_a_trl_conversational_row_with_our_fields():
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, "No.", 0.0)]
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows)
    pair = pairs[0]
    assert pair["prompt"] == REFUND_ENV.messages_for(WITH_ID)
    assert pair["chosen"] == [{"role": "assistant", "content": LOOKUP}]
    assert pair["rejected"] == [{"role": "assistant", "content": "No."}]
    assert (pair["margin"], pair["scenario_id"], pair["constructed"]) == (1.0, "s1", False)


def test_the_length_confound_warning_needs_eight_pairs_with_the_chosen_side_longer():
    def rows_for(count: int) -> list[dict]:
        rows = []
        for n in range(count):
            prompt = f"Where is my order number {n}?"
            rows += [row(prompt, "Could you send the order id?", 1.0), row(prompt, "Ok.", 0.2)]
        return rows

    seven = build_preference_pairs(env=REFUND_ENV, rows=rows_for(7))[1]
    eight = build_preference_pairs(env=REFUND_ENV, rows=rows_for(8))[1]
    assert seven.chosen_longer_share == 1.0 and not any("length" in w for w in seven.warnings)
    assert any("length confound" in warning for warning in eight.warnings)


def test_a_row_without_a_score_is_refused_by_index():
    with pytest.raises(ValueError, match="row 1: field 'score'"):
        build_preference_pairs(env=REFUND_ENV,
                               rows=[row(NO_ID, "a", 1.0), {"prompt": NO_ID, "reply": "b"}])


# ---------------------------------------------------------------- constructed negatives


def test_a_constructed_pair_takes_the_shortest_passing_plain_reply():
    rows = [
        row(NO_ID, "I can help with that. What is your order id?", 1.0),
        row(NO_ID, "Order id?", 1.0),  # shortest passing
        row(NO_ID, "Ok.", 0.2),  # shorter, but fails
        row(NO_ID, LOOKUP, 0.2),  # a call is never the chosen side
    ]
    (pair,) = constructed_negatives(rows, env=REFUND_ENV)
    assert side_text(pair, "chosen") == "Order id?"
    assert side_text(pair, "rejected") == invented_call(NO_ID)
    assert pair["constructed"] is True
    assert pair["margin"] == 0.8  # 1.0 minus 0.2 for a well-formed call on a no-id prompt


def test_constructed_pairs_are_one_per_distinct_prompt_and_skip_prompts_with_an_id():
    rows = [row(NO_ID, "Order id?", 1.0), row(NO_ID, "Which order?", 1.0)]
    rows += rows  # what --balance repeats look like
    rows += [row(OFF_TOPIC, "I only handle orders.", 1.0), row(WITH_ID, "Order id?", 0.3)]
    pairs = constructed_negatives(rows, env=REFUND_ENV)
    assert [p["prompt"][-1]["content"] for p in pairs] == [NO_ID, OFF_TOPIC]


def test_constructed_pairs_are_capped_at_the_share_of_sampled_pairs():
    rows = []
    for n in range(10):
        prompt = f"Where is my order number {n}?"  # no order id: sampled and constructed pairs
        rows += [row(prompt, "What is the order id?", 1.0), row(prompt, "Ok.", 0.2)]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows, constructed_share=0.3)
    assert (report.sampled_pairs, report.constructed_cap, report.constructed_pairs) == (10, 3, 3)
    # the kept three are spread over the ten prompts, not the first three
    kept = [p["prompt"][-1]["content"] for p in pairs if p["constructed"]]
    assert kept == [f"Where is my order number {n}?" for n in (0, 3, 6)]


def test_with_no_sampled_pair_there_is_no_constructed_pair():
    rows = [row(NO_ID, "What is the order id?", 1.0), row(OFF_TOPIC, "Not my area.", 1.0)]
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows, constructed_share=0.3)
    assert pairs == []
    assert report.constructed_cap == 0


def test_the_invented_id_is_stable_and_never_in_the_prompt():
    for prompt in (NO_ID, OFF_TOPIC, "my order 1234 and 5678 and 9012 went missing"):
        call = parse_tool_call(invented_call(prompt))
        order_id = normalize_order_id(call["arguments"]["order_id"])
        assert call["name"] == "lookup_order"
        assert order_id.removeprefix("ORD-") not in prompt
        assert invented_call(prompt) == invented_call(prompt)


def test_the_invented_id_avoids_every_number_the_prompt_holds():
    # every four-digit id but one appears in the prompt, so only that one is left
    prompt = " ".join(str(n) for n in range(1000, 10000) if n != 4242)
    call = parse_tool_call(invented_call(prompt))
    assert call["arguments"]["order_id"] == "ORD-4242"


# ---------------------------------------------------------------- the file


def test_export_then_load_gives_the_same_pairs(tmp_path):
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, "No.", 0.0)]
    rows += [row(NO_ID, "What is the order id?", 1.0, "s2"), row(NO_ID, "Ok.", 0.2, "s2")] * 3
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows, constructed_share=1.0)
    assert any(p["constructed"] for p in pairs)
    path = export_preference(pairs, tmp_path / "pairs.jsonl")
    loaded, skipped = load_pairs(path)
    assert loaded == pairs
    assert skipped == []


def _write_lines(path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _good_line() -> dict:
    rows = [row(WITH_ID, LOOKUP, 1.0), row(WITH_ID, "No.", 0.0)]
    pairs, _ = build_preference_pairs(env=REFUND_ENV, rows=rows)
    return pairs[0]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"rejected": None}, "field 'rejected': missing"),
        ({"chosen": [{"role": "assistant", "content": " "}]}, "field 'chosen': the assistant"),
        ({"rejected": [{"role": "assistant", "content": LOOKUP}]}, "identical to chosen"),
        ({"prompt": []}, "field 'prompt': missing"),
    ],
)
def test_a_bad_pair_line_is_named_with_its_line_number(tmp_path, bad, expected):
    path = tmp_path / "pairs.jsonl"
    _write_lines(path, [json.dumps(_good_line()), json.dumps({**_good_line(), **bad})])
    with pytest.raises(InputFileError, match=expected) as caught:
        load_pairs(path)
    assert str(caught.value).startswith(f"{path}:2: ")
    assert "--skip-invalid" in str(caught.value)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    _write_lines(path, [json.dumps(_good_line()), "", '{"prompt": [', json.dumps(_good_line())])
    with pytest.raises(InputFileError, match=r"pairs.jsonl:3: not valid JSON"):
        load_pairs(path)


def test_skip_invalid_drops_bad_lines_and_reports_each(tmp_path):
    path = tmp_path / "pairs.jsonl"
    good = json.dumps(_good_line())
    missing = json.dumps({**_good_line(), "chosen": []})
    same = json.dumps({**_good_line(), "rejected": _good_line()["chosen"]})
    _write_lines(path, [good, missing, "not json", same, good])
    pairs, skipped = load_pairs(path, skip_invalid=True)
    assert len(pairs) == 2
    assert [problem.split(": ")[0] for problem in skipped] == [f"{path}:{n}" for n in (2, 3, 4)]


def test_a_file_with_no_usable_pair_is_refused_even_when_skipping(tmp_path):
    path = tmp_path / "pairs.jsonl"
    _write_lines(path, ["[1, 2]"])
    with pytest.raises(InputFileError, match="no usable preference pair"):
        load_pairs(path, skip_invalid=True)
    with pytest.raises(InputFileError, match="no such pairs file"):
        load_pairs(tmp_path / "missing.jsonl")


def test_export_refuses_an_unusable_pair_before_writing(tmp_path):
    bad = {**_good_line(), "rejected": _good_line()["chosen"]}
    with pytest.raises(ValueError, match="pair 1 field 'rejected'"):
        export_preference([_good_line(), bad], tmp_path / "pairs.jsonl")
    assert not (tmp_path / "pairs.jsonl").exists()


# ---------------------------------------------------------------- sampling


def test_a_repeated_prompt_is_sampled_once_per_repeat_with_distinct_seeds():
    records = [
        {"prompt": NO_ID, "scenario_id": "a", "category": "no_id"},
        {"prompt": WITH_ID, "scenario_id": "b", "category": "with_id"},
    ]
    rows = sample_pair_rows(REFUND_ENV, records + records[:1], seeded_agent(), 3, seed=0)
    assert [r["prompt"] for r in rows] == [NO_ID] * 6 + [WITH_ID] * 3
    assert len({r["sampling"]["seed"] for r in rows[:6]}) == 6


def test_seeded_samples_of_a_mixed_policy_give_pairs_and_a_report():
    agent = seeded_agent(with_id=Behaviour(right=0.5, refund_first=0.5))
    records = [{"prompt": WITH_ID, "scenario_id": "a", "category": "with_id"}]
    rows = sample_pair_rows(REFUND_ENV, records, agent, 8, seed=0)
    pairs, report = build_preference_pairs(env=REFUND_ENV, rows=rows)
    assert isinstance(report, PairReport)
    assert 1 <= len(pairs) <= 2
    assert all(side_text(p, "chosen") == LOOKUP for p in pairs)


@pytest.mark.parametrize("margin", ["NaN", "1e400"])
def test_a_pairs_line_with_a_margin_that_is_not_finite_is_named(tmp_path, margin):
    line = json.dumps(_good_line()).replace('"margin": 1.0', f'"margin": {margin}')
    assert margin in line
    path = tmp_path / "pairs.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputFileError, match=r"pairs.jsonl:1: "):
        load_pairs(path)


def test_a_pairs_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(json.dumps(_good_line()).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputFileError, match=r"pairs.jsonl:2: not UTF-8 text \(byte 0xff"):
        load_pairs(path)
