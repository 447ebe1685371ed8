"""Behaviour of posttrain.score.delta: paired delta, verdict words, noise band, guards, groups.

Numbers tagged "B.8.n" come from shared/reference/dashboards-stats-style.md, section B.8.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from posttrain.score import stats
from posttrain.score.delta import category_table, delta, noise_band


def graded(scenario: str, reward: int, *, sample: int = 0, category: str = "with_id",
           well_formed: int = 1, tool_call: int = 0, eval_run: int = 0) -> dict:
    """One graded row in the project's row format, with only what a test varies."""
    return {
        "prompt": f"prompt of {scenario}", "scenario_id": scenario, "category": category,
        "sample": sample, "reply": "...", "score": float(reward), "reward": reward,
        "markers": {"well_formed": well_formed, "tool_call": tool_call, "invented_id": 0},
        "policy": {"model": "test"}, "sampling": {"temperature": 0.8}, "eval_run": eval_run,
    }


def evaluation(passes: dict[str, int], samples: int = 4, **fields) -> list[dict]:
    """Rows of one evaluation: scenario -> how many of its ``samples`` passed."""
    return [graded(scenario, int(i < count), sample=i, **fields)
            for scenario, count in passes.items() for i in range(samples)]


def scenarios(n: int, passes, prefix: str = "s") -> dict[str, int]:
    """``n`` scenarios; ``passes`` is a constant or a function of the scenario index."""
    return {f"{prefix}{i}": passes(i) if callable(passes) else passes for i in range(n)}


BASE_A = scenarios(20, lambda i: 1 + i % 2)   # base policy, sampling seed 0
BASE_B = scenarios(20, lambda i: 2 - i % 2)   # base policy, sampling seed 1
QUIET_NOISE = [evaluation(BASE_A), evaluation(scenarios(20, lambda i: 1 + (i % 4 == 0)))]


# --- verdict words -----------------------------------------------------------------------


def test_clear_gain_reads_moved():
    report = delta(evaluation(BASE_A), evaluation(scenarios(20, 4)), noise=QUIET_NOISE)
    assert report.verdict == "moved" and report.ok
    assert report.ci95[0] > 0 and report.delta > report.noise_band_used


def test_identical_runs_read_flat():
    rows = evaluation(BASE_A)
    report = delta(rows, [dict(row) for row in rows], noise=QUIET_NOISE)
    assert report.verdict == "flat" and report.delta == 0.0 and report.ok
    assert report.p_value == 1.0


def test_clear_loss_reads_down_and_fails():
    report = delta(evaluation(scenarios(20, 3)), evaluation(BASE_A), noise=QUIET_NOISE)
    assert report.verdict == "DOWN" and report.ci95[1] < 0
    assert not report.ok


def test_small_gain_inside_a_wide_noise_band_reads_flat_within_noise():
    # every scenario gains exactly 1/4, so the interval is [+0.25, +0.25], above 0; but two
    # runs of the base policy disagree by a whole pass rate per scenario (band ~ +-0.47)
    before = evaluation(scenarios(20, 2))
    after = evaluation(scenarios(20, 3))
    wide = [evaluation(scenarios(20, lambda i: 4 * (i % 2))),
            evaluation(scenarios(20, lambda i: 4 * (1 - i % 2)))]
    report = delta(before, after, noise=wide)
    assert report.ci95 == (0.25, 0.25)
    assert report.noise_band_used > 0.25
    assert report.verdict == "flat (within noise)"


def test_one_evaluation_has_no_band_and_says_so():
    report = delta(evaluation(BASE_A), evaluation(scenarios(20, 4)))
    assert report.verdict == "moved" and report.noise is None
    assert any(w.startswith("no noise band: 1 evaluation") for w in report.warnings)
    assert "(no noise band: 1 evaluation)" in report.format()


def test_under_three_paired_scenarios_is_insufficient_data():
    report = delta(evaluation({"a": 0, "b": 1}), evaluation({"a": 4, "b": 4}))
    assert report.verdict == "insufficient data" and report.ci95 is None
    assert any("no interval: 2 paired scenario(s)" in w for w in report.warnings)


# --- paired statistics -------------------------------------------------------------------


def test_paired_example_5_one_sample_per_scenario():
    # B.8.5: d = 0.3, paired SE 0.15275252316519466, t_9 CI (-0.0455..., 0.6455...),
    # exact sign-flip / McNemar p = 0.25 (Monte Carlo here)
    before = [graded(f"q{i}", r) for i, r in enumerate([1, 0, 1, 1, 0, 0, 1, 0, 1, 0])]
    after = [graded(f"q{i}", r) for i, r in enumerate([1, 1, 1, 1, 0, 1, 1, 0, 1, 1])]
    report = delta(before, after, n_boot=20_000)
    assert math.isclose(report.delta, 0.3, rel_tol=1e-12)
    assert math.isclose(report.se_paired, 0.15275252316519466, rel_tol=1e-12)
    assert report.ci95_t == pytest.approx((-0.04555021441364382, 0.6455502144136438),
                                          rel=1e-10)
    assert abs(report.p_value - 0.25) < 0.015
    assert report.n_paired == 10


def test_paired_example_6_four_samples_per_scenario():
    # B.8.6: counts out of 4, before [1,2,0,4,3,1], after [3,2,1,4,4,2] -> d 0.20833333333333334,
    # paired SE 0.0768295371441074, t_5 CI (0.010836720710345332, 0.4058299459563214)
    before = evaluation(dict(zip("abcdef", [1, 2, 0, 4, 3, 1], strict=True)))
    after = evaluation(dict(zip("abcdef", [3, 2, 1, 4, 4, 2], strict=True)))
    report = delta(before, after)
    assert math.isclose(report.delta, 0.20833333333333334, rel_tol=1e-12)
    assert math.isclose(report.se_paired, 0.0768295371441074, rel_tol=1e-12)
    assert report.ci95_t == pytest.approx((0.010836720710345332, 0.4058299459563214),
                                          rel=1e-10)


def test_report_is_deterministic_for_a_seed():
    before = evaluation(scenarios(15, lambda i: i % 5))
    after = evaluation(scenarios(15, lambda i: (i * 3) % 5))
    first, second = delta(before, after, seed=4), delta(before, after, seed=4)
    assert (first.ci95, first.p_value) == (second.ci95, second.p_value)


def test_detectable_effect_matches_the_power_helper():
    before = evaluation(scenarios(15, lambda i: i % 5))
    after = evaluation(scenarios(15, lambda i: (i * 3) % 5))
    report = delta(before, after)
    sd = report.se_paired * math.sqrt(report.n_paired)
    assert math.isclose(report.detectable_effect, stats.detectable_effect(15, sd))


# --- noise band --------------------------------------------------------------------------


def test_noise_band_is_the_t_interval_half_width_of_a_null_delta():
    # by hand: per-scenario differences between the two base runs are +-1/4 alternating,
    # so band = t_{19} * sd(d, ddof=1) / sqrt(20)
    band = noise_band([evaluation(BASE_A), evaluation(BASE_B)])
    differences = [0.25 if i % 2 == 0 else -0.25 for i in range(20)]
    expected = stats.t_critical(19) * stats.standard_error(differences)
    assert math.isclose(band.band, expected, rel_tol=1e-12)
    assert band.df == 19 and band.n_repeats == 2 and band.n_scenarios == 20


def test_noise_band_reports_the_run_spread():
    band = noise_band([evaluation(BASE_A), evaluation(scenarios(20, 1))])
    assert band.pass_at_1 == [0.375, 0.25]
    assert math.isclose(band.max_repeat_delta, 0.125)
    assert math.isclose(band.run_std, 0.125 / math.sqrt(2))


def test_noise_band_with_one_evaluation_has_no_band():
    band = noise_band([evaluation(BASE_A)])
    assert band.band is None and band.note == "no noise band: 1 evaluation"


def test_noise_band_is_read_from_before_rows_with_several_eval_runs():
    before = evaluation(BASE_A, eval_run=0) + evaluation(BASE_B, eval_run=1)
    report = delta(before, evaluation(scenarios(20, 4)))
    assert report.noise is not None and report.noise.n_repeats == 2
    assert "from 2 base evaluations" in report.format()


def test_noise_band_to_dict_is_json_safe_and_small():
    data = noise_band([evaluation(BASE_A), evaluation(BASE_B)]).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert "pair_differences" not in data


# --- guards ------------------------------------------------------------------------------


def test_a_falling_guard_is_named_and_fails_the_report():
    before = evaluation(BASE_A, well_formed=1)
    after = [{**row, "markers": {**row["markers"], "well_formed": int(row["sample"] < 2)}}
             for row in evaluation(scenarios(20, 4))]
    report = delta(before, after, noise=QUIET_NOISE)
    assert report.verdict == "moved"
    assert report.regressions == ["well_formed"] and not report.ok
    assert "guard  well_formed 1.00 -> 0.50  -0.50 [-0.50, -0.50]  FELL" in report.format()


def test_a_constant_guard_is_degenerate():
    report = delta(evaluation(BASE_A), evaluation(scenarios(20, 4)), noise=QUIET_NOISE)
    assert report.degenerate_guards == ["well_formed"] and report.ok
    assert ("guard  well_formed 1.00 -> 1.00 (degenerate: constant on both sides)"
            in report.format())


def test_a_guard_missing_from_the_rows_is_reported_not_checked():
    report = delta(evaluation(BASE_A), evaluation(BASE_B), guards=("grounded",))
    assert report.guards == []
    assert any("guard 'grounded' is not on every row" in w for w in report.warnings)


# --- pairing -----------------------------------------------------------------------------


def test_unpaired_scenarios_are_counted_and_left_out():
    before = evaluation(scenarios(20, 1))
    after = evaluation({**scenarios(18, 4), "new0": 0, "new1": 0, "new2": 0})
    report = delta(before, after)
    assert (report.n_paired, report.n_unpaired_before, report.n_unpaired_after) == (18, 2, 3)
    assert report.delta == 0.75 and report.comparable
    assert any("2 scenario(s) only before and 3 only after" in w for w in report.warnings)


def test_fewer_than_half_paired_is_not_comparable():
    before = evaluation(scenarios(10, 1))
    after = evaluation({**scenarios(4, 4), **scenarios(10, 4, prefix="other")})
    report = delta(before, after)
    assert report.verdict == "NOT COMPARABLE" and not report.ok and not report.comparable
    assert any(w.startswith("NOT COMPARABLE: only 4 of 20 scenarios") for w in report.warnings)


# --- groups ------------------------------------------------------------------------------


def two_category_runs() -> tuple[list[dict], list[dict]]:
    """with_id (10 scenarios) gains and calls tools more; no_id (8) loses."""
    before = (evaluation(scenarios(10, 1, "w"), category="with_id")
              + evaluation(scenarios(8, 4, "n"), category="no_id"))
    after = (evaluation(scenarios(10, 4, "w"), category="with_id", tool_call=1)
             + evaluation(scenarios(8, lambda i: 2 + i % 2, "n"), category="no_id"))
    return before, after


def test_group_that_falls_is_flagged_down_without_failing_the_report():
    before, after = two_category_runs()
    report = delta(before, after, by="category")
    assert [g.name for g in report.groups] == ["with_id", "no_id"]
    with_id, no_id = report.groups
    assert with_id.verdict == "moved" and not with_id.down
    assert no_id.down and no_id.verdict == "DOWN" and report.groups_down == ["no_id"]
    assert (with_id.tool_call_before, with_id.tool_call_after) == (0.0, 1.0)
    assert report.ok  # groups going DOWN warn; they do not flip ok
    lines = report.format().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("by category"))
    assert lines[header + 2].startswith("no_id") and lines[header + 2].endswith("DOWN")


def test_small_groups_are_marked_low_n():
    before = evaluation(scenarios(12, 1, "w"), category="with_id") + evaluation(
        scenarios(4, 2, "o"), category="off_topic")
    after = evaluation(scenarios(12, 3, "w"), category="with_id") + evaluation(
        scenarios(4, 2, "o"), category="off_topic")
    groups = {g.name: g for g in delta(before, after, by="category").groups}
    assert groups["off_topic"].low_n and not groups["with_id"].low_n


def test_category_table_for_one_run():
    rows = (evaluation(scenarios(5, 2, "w"), category="with_id", tool_call=1)
            + evaluation(scenarios(3, 4, "n"), category="no_id"))
    table = category_table(rows)
    assert [(g.name, g.pass_at_1, g.n_scenarios, g.n_rows, g.tool_call_rate) for g in table] == [
        ("with_id", 0.5, 5, 20, 1.0), ("no_id", 1.0, 3, 12, 0.0)]


# --- output ------------------------------------------------------------------------------


def test_text_report_shape():
    report = delta(evaluation(BASE_A), evaluation(scenarios(20, 4)), noise=QUIET_NOISE)
    lines = report.format().splitlines()
    assert re.fullmatch(r"pass@1 before 0\.38 \[0\.\d\d, 0\.\d\d\] "
                        r"\(n=20 scenarios, 20 prompts x 4\)", lines[0]), lines[0]
    assert lines[1] == "pass@1 after  1.00 [1.00, 1.00] (n=20 scenarios, 20 prompts x 4)"
    band = f"{report.noise_band_used:.2f}"
    assert lines[2].startswith("delta  +0.62 [")
    assert lines[2].endswith(f"paired over 20 scenarios, p<0.001  -> moved "
                             f"(noise band ±{band} from 2 base evaluations)")


def test_markdown_report_has_tables():
    before, after = two_category_runs()
    text = delta(before, after, by="category").format_markdown()
    assert "| before | 0.58 |" in text and "| category | n |" in text
    assert "| no_id | 8 |" in text


def test_to_dict_is_json_safe():
    before, after = two_category_runs()
    data = delta(before, after, by="category", noise=QUIET_NOISE).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["groups_down"] == ["no_id"] and data["before"]["n_scenarios"] == 18


def test_marker_target():
    before, after = two_category_runs()
    report = delta(before, after, target="marker:tool_call")
    assert report.before.label == "tool_call" and report.delta == pytest.approx(10 / 18)
    assert report.format().startswith("tool_call before 0.00")


def test_repeats_that_differ_systematically_are_called_out():
    # the second "repeat" passes one sample fewer in every scenario: a shift no sampling seed
    # makes, and one the ddof=1 spread (zero here) cannot see
    shifted = evaluation(scenarios(20, lambda i: i % 2))
    report = delta(evaluation(BASE_A), evaluation(scenarios(20, 4)),
                   noise=[evaluation(BASE_A), shifted])
    assert any("two evaluations of the base policy differ by 0.25" in w for w in report.warnings)
