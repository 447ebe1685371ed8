"""The shipped refund holdout (`--holdout-set refund-holdout`): built by its grammar,
passed through both filters, counted per category, and used whole by the data step."""

import json

import pytest

from posttrain.cli import main
from posttrain.data.prepare import DataConfig, prepare_data
from posttrain.data.prompts import load_prompts, make_record, save_prompts, summary
from posttrain.envs import get_env
from posttrain.envs.refund import REFUND_ENV
from posttrain.envs.refund.holdout import (
    NAME,
    NEAR_DUPLICATE_JACCARD,
    SHIPPED_FILE,
    SITUATIONS,
    build_holdout,
)
from posttrain.envs.refund.prompts import simulate
from posttrain.errors import PosttrainError
from posttrain.text import jaccard, word_set

# the counts README and docs/statistics.md state
SHIPPED_COUNTS = {"prompts": 477, "scenarios": 477, "with_id": 271, "no_id": 132,
                  "off_topic": 74}


@pytest.fixture(scope="module")
def default_build():
    """``build_holdout()`` at the shipped situations and seed, built once for the module."""
    return build_holdout()


def shipped_lines():
    return [json.loads(line) for line in SHIPPED_FILE.read_text(encoding="utf-8").splitlines()]


def test_the_shipped_file_is_exactly_what_the_grammar_builds(default_build, tmp_path):
    records, report = default_build
    rebuilt = save_prompts(tmp_path / "rebuilt.jsonl", records)
    assert rebuilt.read_bytes() == SHIPPED_FILE.read_bytes()
    assert report.written == SITUATIONS
    assert report.kept == len(records) == SHIPPED_COUNTS["prompts"]
    dropped = (report.dropped_category + report.dropped_ground_truth
               + report.dropped_near_duplicate + report.dropped_near_template)
    assert report.kept + dropped == report.written
    assert report.by_category == {k: SHIPPED_COUNTS[k] for k in REFUND_ENV.categories}


def test_its_counts_per_category_and_one_scenario_per_prompt():
    records = load_prompts(SHIPPED_FILE, env=REFUND_ENV)
    assert summary(records) == SHIPPED_COUNTS
    assert all(record["scenario_id"].startswith("hx-") for record in records)


def test_every_prompt_reads_back_as_its_category_and_exact_id():
    for line in shipped_lines():
        reread = make_record(line["prompt"], env=REFUND_ENV)
        assert (reread["category"], reread["case"]) == (line["category"], line["case"]), line


def test_no_two_prompts_are_near_duplicates():
    words = [word_set(line["prompt"]) for line in shipped_lines()]
    closest = max(jaccard(a, b) for i, a in enumerate(words) for b in words[i + 1:])
    assert closest < NEAR_DUPLICATE_JACCARD


@pytest.mark.parametrize("data_seed", [0, 7, 12345])
def test_no_prompt_is_near_one_the_template_writer_trains_on(data_seed):
    # seed 0 is in the pool the build filters against; 7 and 12345 are not: the grammar's
    # sentences are its own, so no seed's template prompts come close
    template = [word_set(r["prompt"]) for r in simulate(400, seed=data_seed)]
    for line in shipped_lines():
        words = word_set(line["prompt"])
        assert all(jaccard(words, other) < NEAR_DUPLICATE_JACCARD for other in template), line


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_whatever_the_seed_kept_messages_pass_both_filters(seed):
    records, report = build_holdout(150, seed)
    assert report.written == 150 and report.kept == len(records) > 100
    for record in records:
        reread = make_record(record["prompt"], env=REFUND_ENV)
        assert reread["category"] == record["category"]
        assert reread["case"] == record["case"]


def test_the_category_filter_drops_a_message_that_reads_as_another_category(default_build):
    # at the shipped seed two off-topic asks drew the customer line "I'm ordering for my
    # company", which the rule reads as about an order: the filter dropped both
    _, report = default_build
    assert report.dropped_category == 2
    assert not any("ordering for my company" in line["prompt"] and line["category"] ==
                   "off_topic" for line in shipped_lines())


def test_the_data_step_holds_the_named_set_out_whole():
    data = prepare_data(DataConfig(holdout_set=NAME), REFUND_ENV)
    assert summary(data.holdout) == SHIPPED_COUNTS
    written = simulate(400, seed=0)
    assert len(data.train) == len(written)  # no template prompt is in the set
    assert f"holdout set {NAME!r} (477 prompts)" in data.source
    assert "the shipped set 'refund-holdout', whole" in data.split


def test_train_prompts_that_are_in_the_set_are_dropped(tmp_path):
    shipped = shipped_lines()
    mixed = tmp_path / "mixed.jsonl"
    save_prompts(mixed, [make_record(line["prompt"].upper(), f"copy-{i}", env=REFUND_ENV)
                         for i, line in enumerate(shipped[:5])]
                 + [make_record(f"Refund ORD-{100 + i} please", f"own-{i}", env=REFUND_ENV)
                    for i in range(6)])
    data = prepare_data(DataConfig(prompts_file=str(mixed), holdout_set=NAME), REFUND_ENV)
    assert [r["scenario_id"] for r in data.train] == [f"own-{i}" for i in range(6)]
    assert "(5 dropped as they are in the set)" in data.split


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(PosttrainError, match=r"ships no prompt set of that name "
                       r"\(it ships: refund-holdout\)"):
        prepare_data(DataConfig(holdout_set="refund-large"), REFUND_ENV)


def test_an_empty_name_is_refused_not_ignored(capsys):
    assert main(["eval", "--agent", "seeded", "--holdout-set", ""]) != 0
    assert "(it ships: refund-holdout)" in capsys.readouterr().err


def test_an_environment_without_sets_says_what_to_use_instead():
    with pytest.raises(PosttrainError, match=r"ships no named prompt sets.*--holdout"):
        prepare_data(DataConfig(holdout_set=NAME), get_env("refund-multiturn"))


def test_eval_measures_on_the_set_by_name(capsys):
    assert main(["eval", "--agent", "seeded", "--holdout-set", NAME]) == 0
    captured = capsys.readouterr()
    assert "(n=477 scenarios, 477 prompts x 4)" in captured.out
    assert "holdout   477 prompts,  477 scenarios" in captured.err


def test_eval_refuses_an_unknown_set_by_name(capsys):
    assert main(["eval", "--agent", "seeded", "--holdout-set", "nope"]) != 0
    assert "--holdout-set 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_recipe_measures_on_the_set_by_name(starter_2m_folder, tmp_path, capsys):
    runs_root = tmp_path
    # one base evaluation and one step: the 477 prompts are evaluated twice, not three times
    code = main(["sft", "--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
                 "--eval-repeats", "1", "--steps", "1", "--batch-size", "4",
                 "--holdout-set", NAME, "--runs-dir", str(runs_root), "--run-name", "big"])
    run = runs_root / "big"
    summary = json.loads((run / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1)
    assert summary["before"]["n_scenarios"] == summary["after"]["n_scenarios"] == 477
    assert json.loads((run / "config.json").read_text())["settings"]["holdout_set"] == NAME
    rows = [json.loads(line) for line in (run / "holdout_after.jsonl").open()]
    shipped = {line["scenario_id"] for line in shipped_lines()}
    assert {row["scenario_id"] for row in rows} == shipped
    demos = [json.loads(line) for line in (run / "demos.jsonl").open()]
    assert demos and not {demo["scenario_id"] for demo in demos} & shipped
    assert "holdout set 'refund-holdout' (477 prompts)" in capsys.readouterr().out
