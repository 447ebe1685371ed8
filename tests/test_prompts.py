"""Prompt sets: JSONL validation, splits by scenario, balance and the near-duplicate filter."""

import json
from collections import Counter

import pytest

from posttrain.data.prompts import (
    balance,
    drop_near_duplicates,
    keep_category,
    load_prompts,
    make_record,
    save_prompts,
    split_holdout,
    split_holdout_stratified,
    summary,
)
from posttrain.envs.refund.prompts import simulate
from posttrain.errors import InputFileError


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_round_trip_and_case_is_rederived(tmp_path):
    path = write_lines(
        tmp_path / "p.jsonl",
        [
            json.dumps(
                {
                    "prompt": "Refund ORD-4017 please",
                    "scenario_id": "a",
                    "case": {"order_id": "ORD-1", "in_domain": False},
                    "category": "off_topic",
                }
            ),
            "",
            json.dumps({"prompt": "Tell me a joke", "scenario_id": 7, "seed": "Tell me a joke."}),
        ],
    )
    records = load_prompts(path)
    assert records[0]["case"] == {"order_id": "ORD-4017", "in_domain": True}  # never trusted
    assert records[0]["category"] == "with_id"
    assert records[1]["scenario_id"] == "7" and records[1]["seed"] == "Tell me a joke."
    save_prompts(tmp_path / "out.jsonl", records)
    assert load_prompts(tmp_path / "out.jsonl") == records


def test_scenario_defaults_to_the_prompt(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "Where is my order?"})])
    assert load_prompts(path)[0]["scenario_id"] == "Where is my order?"


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"p.jsonl:2: not valid JSON"),
        ("[1, 2]", r"p.jsonl:2: expected a JSON object"),
        (
            json.dumps({"scenario_id": "x"}),
            r"p.jsonl:2: field 'prompt': expected a non-empty string",
        ),
        (json.dumps({"prompt": "  "}), r"p.jsonl:2: field 'prompt'"),
        (json.dumps({"prompt": "hi", "scenario_id": [1]}), r"p.jsonl:2: field 'scenario_id'"),
        (json.dumps({"prompt": "hi", "seed": 5}), r"p.jsonl:2: field 'seed'"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, message):
    path = write_lines(tmp_path / "p.jsonl", [json.dumps({"prompt": "ok"}), line])
    with pytest.raises(InputFileError, match=message):
        load_prompts(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        load_prompts(tmp_path / "absent.jsonl")
    with pytest.raises(InputFileError, match="holds no prompts"):
        load_prompts(write_lines(tmp_path / "e.jsonl", [""]))


def test_save_is_atomic_on_failure(tmp_path):
    target = tmp_path / "p.jsonl"
    save_prompts(target, [make_record("Tell me a joke")])
    with pytest.raises(TypeError):
        save_prompts(target, [make_record("x"), {"prompt": object(), "scenario_id": "s"}])
    assert load_prompts(target)[0]["prompt"] == "Tell me a joke"  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl"]  # no temp file left


def test_split_is_by_scenario_and_seed_independent():
    records = simulate(200, seed=0)
    train, holdout = split_holdout(records, 0.2)
    assert len(train) + len(holdout) == len(records)
    assert not {r["scenario_id"] for r in train} & {r["scenario_id"] for r in holdout}
    # the same records in another order split the same way
    _, holdout2 = split_holdout(list(reversed(records)), 0.2)
    assert sorted(r["prompt"] for r in holdout2) == sorted(r["prompt"] for r in holdout)
    # numbers reported in the README (seed 0, 200 situations)
    assert (len(train), len(holdout)) == (208, 50)


def test_stratified_split_measures_every_category():
    records = [make_record(f"Refund ORD-{1000 + i}", f"w{i}") for i in range(20)]
    records += [make_record("Where is my order?", "n1"), make_record("My order is late", "n2")]
    records += [make_record("Tell me a joke", "o1")]
    train, holdout = split_holdout_stratified(records, 0.2)
    held = Counter(r["category"] for r in holdout)
    assert held == {"with_id": 4, "no_id": 1}  # the lone off-topic scenario stays in train
    assert Counter(r["category"] for r in train)["no_id"] == 1
    assert not {r["scenario_id"] for r in train} & {r["scenario_id"] for r in holdout}
    assert split_holdout_stratified(records, 0.2) == (train, holdout)


def test_bad_fraction():
    with pytest.raises(ValueError, match="between 0 and 1"):
        split_holdout([], 1.5)


def test_balance_repeats_minority_rows_up_to_the_share():
    records = [make_record(f"Refund ORD-{1000 + i}", f"w{i}") for i in range(18)]
    records += [make_record("Where is my order?", "n1"), make_record("Tell me a joke", "o1")]
    balanced = balance(records, 0.25)
    counts = Counter(r["category"] for r in balanced)
    assert balanced[: len(records)] == records  # originals first, in order
    assert counts["no_id"] == 6 and counts["off_topic"] == 6  # capped at 6 copies each
    assert balance(records, 0.0) == records
    assert balance(records, 0.05) == records  # already above 5%


def test_balance_on_template_set_reaches_share():
    train, _ = split_holdout(simulate(200, seed=0))
    counts = Counter(r["category"] for r in balance(train, 0.25))
    total = sum(counts.values())
    assert all(counts[name] / total >= 0.2 for name in counts)


def test_near_duplicate_filter_uses_word_set_jaccard():
    records = [
        make_record("Where is my order? It has not arrived."),
        make_record("where is my order, it has not arrived"),  # same words
        make_record("Where is my order? It has not arrived yet."),  # Jaccard 7/8 >= 0.8
        make_record("Tell me a joke"),
    ]
    kept, dropped = drop_near_duplicates(records, 0.8)
    assert [r["prompt"] for r in kept] == [
        "Where is my order? It has not arrived.",
        "Tell me a joke",
    ]
    assert dropped == 2


def test_category_filter_and_summary():
    records = [make_record("Refund ORD-1234", "a"), make_record("Tell me a joke", "b")]
    kept, dropped = keep_category(records, {"a": "with_id", "b": "no_id"})
    assert [r["scenario_id"] for r in kept] == ["a"] and dropped == 1
    assert summary(records) == {"prompts": 2, "scenarios": 2, "off_topic": 1, "with_id": 1}


def test_a_file_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputFileError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9"):
        load_prompts(path)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_numbers_json_does_not_allow_are_refused(tmp_path, number):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello", "scenario_id": "a", "extra": ' + number + "}\n")
    with pytest.raises(InputFileError, match=r"p.jsonl:1: not valid JSON"):
        load_prompts(path)


def test_writing_onto_a_folder_or_zero_prompts_is_a_clear_error(tmp_path, capsys):
    from posttrain.cli import main

    assert main(["prompts", "write", str(tmp_path)]) == 2
    assert "is a folder: give a file name to write to" in capsys.readouterr().err
    assert main(["prompts", "write", str(tmp_path / "p.jsonl"), "--prompts", "0"]) == 2
    assert "--prompts must be at least 1, got 0" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written, no temp file left


def test_a_prompt_longer_than_the_cap_is_refused_on_load(tmp_path):
    from posttrain.data.prompts import MAX_PROMPT_CHARS

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}) + "\n")
    with pytest.raises(InputFileError, match=r"p.jsonl:1: field 'prompt': 20,001 characters"):
        load_prompts(path)
