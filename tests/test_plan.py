"""A run's plan (posttrain.train.plan, posttrain.train.grpo.plan): every automatic choice
made once, from evidence, after the base's first evaluation; frozen; said as one block and
written once to config.json and summary.json; `--plan-only` stops there."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.cli import main
from posttrain.score.stats import clopper_pearson_upper
from posttrain.train.grpo import plan as grpo_plan
from posttrain.train.grpo.cold_start_choice import (
    CategorySignal,
    choose_cold_start,
)
from posttrain.train.grpo.cold_start_shape import MIN_GROUPS, choose_cold_start_shape
from posttrain.train.plan import PlanLine, plan_block
from tests.test_cold_start import REFUND, rows

TINY = ["--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "1",
        "--steps", "1", "--monitor-every", "0"]


def test_the_upper_bound_is_the_exact_one():
    # 0 of n: 1 - 0.05 ** (1 / n), the closed form ("rule of three": about 3 / n)
    assert clopper_pearson_upper(0, 59) == pytest.approx(1 - 0.05 ** (1 / 59))
    assert clopper_pearson_upper(0, 300) == pytest.approx(3 / 300, rel=0.01)
    # 1 of 20: the p where P(X <= 1; 20, p) = 0.05 is 0.2161 (scipy's beta.ppf(0.95, 2, 19))
    assert clopper_pearson_upper(1, 20) == pytest.approx(0.2161, abs=1e-4)
    assert clopper_pearson_upper(5, 5) == 1.0
    with pytest.raises(ValueError):
        clopper_pearson_upper(4, 3)


def test_a_zero_from_a_few_replies_decides_nothing():
    # the AVX2 CPU's tiny run: no_id passed 0 of its 3 holdout replies
    base = rows("no_id", [[0.0]] * 3) + rows("with_id", [[1.0], [0.3]] * 5)
    choice = choose_cold_start("auto", REFUND, base)
    assert not choice.run
    assert choice.reason.startswith("auto: too few replies to decide: no_id 0 of 3, 59 needed")
    assert "RL runs from the base" in choice.reason
    # 59 replies of none passed show the rate under the mark: the cold start runs
    shown = choose_cold_start("auto", REFUND, rows("no_id", [[0.0]] * 59))
    assert shown.run and "no_id 0/59 passed" in shown.reason


def test_a_rate_shown_low_counts_even_with_a_pass_or_two():
    # 1 of 200 (upper bound 0.023) is shown under the mark; 4 of 100 (0.089) is not yet
    low = CategorySignal("with_id", replies=200, passed=1)
    unsure = CategorySignal("with_id", replies=100, passed=4)
    assert low.shown_low() and not unsure.shown_low() and unsure.seen_low()
    needed = unsure.replies_needed()
    # at the same rate, that many replies show it low, one fewer do not
    assert CategorySignal("with_id", needed, round(0.04 * needed)).shown_low()
    assert not CategorySignal("with_id", needed - 1, round(0.04 * (needed - 1))).shown_low()


def test_the_shape_reads_alike_groups_only_from_enough_of_them():
    few = choose_cold_start("sft", REFUND, rows("with_id", [[0.0] * 10] * (MIN_GROUPS - 4)))
    name, reason = choose_cold_start_shape("auto", few)
    assert name == "full"
    assert reason == (f"auto: too few groups to read the shape: with_id {MIN_GROUPS - 4} "
                      f"groups, {MIN_GROUPS} needed; the default")
    enough = choose_cold_start("sft", REFUND, rows("with_id", [[0.0] * 4] * MIN_GROUPS))
    assert choose_cold_start_shape("auto", enough)[0] == "light"


#: the suite's tiny configs: a category of a few prompts, one to four replies each
TINY_CATEGORY = st.lists(st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=1, max_size=4),
                         min_size=1, max_size=10)


def _auto_plan(base: list[dict]) -> tuple[bool, str]:
    choice = choose_cold_start("auto", REFUND, base)
    return choice.run, choose_cold_start_shape("auto", choice)[0]


@settings(max_examples=200, deadline=None)
@given(with_id=TINY_CATEGORY, no_id=TINY_CATEGORY, extra=st.sampled_from([0.0, 0.3, 1.0]),
       category=st.sampled_from(["with_id", "no_id"]), remove=st.booleans())
def test_on_the_tiny_configs_one_reply_more_or_less_changes_no_choice(
        with_id, no_id, extra, category, remove):
    base = rows("with_id", with_id) + rows("no_id", no_id)
    changed = [dict(row) for row in base]
    if remove:
        index = next(i for i, row in enumerate(changed) if row["category"] == category)
        changed.pop(index)
    else:
        changed.append({"category": category, "eval_run": 0, "prompt": f"{category} new",
                        "score": extra, "reward": 1 if extra == 1.0 else 0})
    assert _auto_plan(changed) == _auto_plan(base) == (False, "full")


def test_the_plan_is_frozen_and_reads_as_one_block():
    line = PlanLine("cold start", "none", "auto: ...", evidence="with_id 0.42")
    with pytest.raises(dataclasses.FrozenInstanceError):
        line.choice = "sft"  # type: ignore[misc]
    assert plan_block([line, PlanLine("precision", "float32", "auto: ...")]) == [
        "plan:", "  cold start: none (auto: ...) [evidence: with_id 0.42]",
        "  precision: float32 (auto: ...)"]
    assert grpo_plan.GRPOPlan.__dataclass_params__.frozen


@pytest.mark.slow
def test_plan_only_says_every_choice_and_trains_nothing(starter_2m_folder, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["grpo", *TINY, "--plan-only", "--runs-dir", str(runs), "--run-name", "p"])
    assert code == 0
    out = capsys.readouterr().out
    block = out[out.index("plan:\n"):].splitlines()
    whats = [text.strip().split(":", 1)[0] for text in block[1:9]]
    assert whats == ["baseline", "cold start", "precision", "rollouts", "shared prefix",
                     "dynamic sampling", "stop", "guards"]
    assert "plan only (--plan-only): the baseline ran; nothing trains" in out
    folder = runs / "p"
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    assert config["plan"] == summary["plan"] and config["plan"]["plan_only"] is True
    assert [c["what"] for c in config["plan"]["choices"]] == whats
    assert summary["status"] == "done" and "train_s" not in summary["timings"]
    assert not (folder / "adapter").exists() and not (folder / "holdout_after.jsonl").exists()
    # the base evaluated once: the plan's evidence, nothing more
    rows_before = [json.loads(line) for line in (folder / "holdout_before.jsonl").open()]
    assert {row["eval_run"] for row in rows_before} == {0}
    # the tiny config's counts are too few to decide: the cold start keeps its default
    cold = config["plan"]["choices"][1]
    assert cold["choice"] == "none"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["sft", "dpo"])
def test_sft_and_dpo_plan_their_precision_and_guards(recipe, starter_2m_folder, tmp_path,
                                                      capsys):
    runs = tmp_path / "runs"
    flags = [flag for flag in TINY if flag not in ("--monitor-every", "0")]
    code = main([recipe, *flags, "--plan-only", "--runs-dir", str(runs), "--run-name", "p"])
    assert code == 0
    out = capsys.readouterr().out
    assert "plan:\n  precision: float32 (auto: " in out and "\n  guards: " in out
    summary = json.loads((runs / "p" / "summary.json").read_text())
    assert [c["what"] for c in summary["plan"]["choices"]] == ["precision", "guards"]
    assert not (runs / "p" / "adapter").exists()


@pytest.mark.slow
def test_nothing_changes_the_settings_or_the_data_after_the_plan(starter_2m_folder, tmp_path,
                                                                 monkeypatch):
    """A light-shaped cold start (which used to rewrite the run's settings and train
    prompts half way) leaves the context's settings and data as they were when the plan
    was made; the step trains on the plan's own."""
    seen = {}
    made = grpo_plan.plan_grpo

    def plan_and_remember(context, before):
        plan = made(context, before)
        seen.update(context=context, plan=plan, settings=dataclasses.asdict(context.settings),
                    train=list(context.data.train))
        return plan

    monkeypatch.setattr("posttrain.train.grpo.run.plan_grpo", plan_and_remember)
    runs = tmp_path / "runs"
    code = main(["grpo", *TINY, "--eval-samples", "2", "--num-generations", "4",
                 "--cold-start", "sft", "--cold-start-shape", "light", "--cold-start-steps",
                 "2", "--runs-dir", str(runs), "--run-name", "frozen"])
    assert code in (0, 1)
    context, plan = seen["context"], seen["plan"]
    assert dataclasses.asdict(context.settings) == seen["settings"]
    assert list(context.data.train) == seen["train"]
    # the plan holds the shaped settings and train prompts, the context the asked ones
    assert (plan.settings.beta, context.settings.beta) == (0.2, 0.04)
    assert len(plan.train) > len(context.data.train)
    config = json.loads((runs / "frozen" / "config.json").read_text())
    assert config["settings"]["beta"] == 0.2 and config["plan"]["choices"][2]["what"] == \
        "cold start shape"
