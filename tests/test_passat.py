"""Behaviour of posttrain.score.passat.pass_at: scenario-level pass@1 with interval and n.

Numbers tagged "B.8.n" come from shared/reference/dashboards-stats-style.md, section B.8.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from posttrain.score.passat import pass_at


def graded(scenario: str, reward: int, *, prompt: str | None = None, sample: int = 0,
           category: str = "with_id", well_formed: int = 1, tool_call: int = 0,
           eval_run: int = 0) -> dict:
    """One graded row in the project's row format, with only what a test varies."""
    return {
        "prompt": prompt if prompt is not None else f"prompt of {scenario}",
        "scenario_id": scenario, "category": category, "sample": sample, "reply": "...",
        "score": float(reward), "reward": reward,
        "markers": {"well_formed": well_formed, "tool_call": tool_call, "invented_id": 0},
        "policy": {"model": "test"}, "sampling": {"temperature": 0.8}, "eval_run": eval_run,
    }


def scenario_rows(scenario: str, passes: int, samples: int, **fields) -> list[dict]:
    """``samples`` rows of one prompt of ``scenario``, the first ``passes`` of them passing."""
    return [graded(scenario, int(i < passes), sample=i, **fields) for i in range(samples)]


def test_pass_at_1_weighs_scenarios_not_rows():
    # scenario a: 3 phrasings, all pass; scenario b: 1 phrasing, fails.
    # Row mean would be 3/4; the scenario mean is (1 + 0) / 2.
    rows = [graded("a", 1, prompt=f"phrasing {i}") for i in range(3)] + [graded("b", 0)]
    result = pass_at(rows)
    assert result.pass_at_1 == 0.5
    assert result.per_scenario == {"a": 1.0, "b": 0.0}
    assert (result.n_scenarios, result.n_prompts, result.n_rows) == (2, 4, 4)


def test_k_samples_example_gives_the_clustered_se():
    # B.8.4: K = 4, correct counts [4, 3, 0, 2, 1] -> mean 0.5, SE over prompt means
    # 0.1767766952966369 (= clustered SE with P/(P-1) on the 20 pooled rows)
    rows = [r for i, c in enumerate([4, 3, 0, 2, 1]) for r in scenario_rows(f"s{i}", c, 4)]
    result = pass_at(rows)
    assert result.pass_at_1 == 0.5
    assert math.isclose(result.se_clustered, 0.1767766952966369, rel_tol=1e-12)
    assert result.samples_per_prompt == 4 and result.k == 4


def test_pass_at_k_and_pass_pow_k_over_scenarios():
    # B.8.2: four problems with n = 8 samples, c = [3, 0, 8, 5], k = 4 ->
    # pass@4 mean 0.7321428571428572. pass^4 = mean of C(c,4)/C(8,4) = (0 + 0 + 1 + 5/70) / 4
    # (B.6 formula applied to the same table).
    rows = [r for i, c in enumerate([3, 0, 8, 5]) for r in scenario_rows(f"p{i}", c, 8)]
    result = pass_at(rows, k=4)
    assert math.isclose(result.pass_at_k, 0.7321428571428572, rel_tol=1e-12)
    assert math.isclose(result.pass_pow_k, (1 + 5 / 70) / 4, rel_tol=1e-12)
    assert result.n_scenarios_at_k == 4


def test_k_defaults_to_samples_per_prompt_and_is_none_for_one_sample():
    many = [r for i in range(3) for r in scenario_rows(f"s{i}", 1, 4)]
    assert pass_at(many).k == 4
    single = [graded(f"s{i}", i % 2) for i in range(5)]
    result = pass_at(single)
    assert result.k is None and result.pass_at_k is None and result.pass_pow_k is None


def test_pass_at_k_skips_scenarios_with_fewer_than_k_rows_and_says_so():
    rows = scenario_rows("full", 2, 4) + scenario_rows("short", 1, 2) + scenario_rows("x", 0, 4)
    result = pass_at(rows, k=4)
    assert result.n_scenarios_at_k == 2
    assert "pass@4 over 2 of 3 scenarios" in result.note


def test_wilson_interval_when_every_scenario_has_one_sample():
    # B.8.1: 9 of 100 -> Wilson (0.04807254000256516, 0.1622621285271631)
    rows = [graded(f"s{i}", int(i < 9)) for i in range(100)]
    result = pass_at(rows)
    assert result.pass_at_1 == 0.09
    assert result.wilson95 == pytest.approx((0.04807254000256516, 0.1622621285271631),
                                            rel=1e-12)


def test_no_wilson_interval_with_several_samples_per_scenario():
    rows = [r for i in range(4) for r in scenario_rows(f"s{i}", i, 4)]
    assert pass_at(rows).wilson95 is None


def test_fewer_than_three_scenarios_gives_no_interval_and_a_note():
    rows = scenario_rows("a", 3, 4) + scenario_rows("b", 1, 4)
    result = pass_at(rows)
    assert result.ci95 is None
    assert "no interval on pass@1: 2 scenario(s)" in result.note
    assert str(result) == "pass@1 0.50 [n/a] (n=2 scenarios, 2 prompts x 4)"


def test_bootstrap_interval_is_deterministic_for_a_seed():
    rows = [r for i in range(12) for r in scenario_rows(f"s{i}", i % 5, 4)]
    first = pass_at(rows, seed=11)
    assert pass_at(rows, seed=11).ci95 == first.ci95
    low, high = first.ci95
    assert low < first.pass_at_1 < high


def test_printed_shape_with_even_samples():
    rows = [r for i in range(40) for r in scenario_rows(f"s{i}", i % 3, 4)]
    text = str(pass_at(rows))
    shape = r"pass@1 \d\.\d\d \[\d\.\d\d, \d\.\d\d\] \(n=40 scenarios, 40 prompts x 4\)"
    assert re.fullmatch(shape, text), text


def test_printed_shape_exact_when_the_interval_is_known():
    # every scenario passes 2 of 4, so every bootstrap resample has mean 0.5
    rows = [r for i in range(3) for r in scenario_rows(f"s{i}", 2, 4)]
    assert str(pass_at(rows)) == "pass@1 0.50 [0.50, 0.50] (n=3 scenarios, 3 prompts x 4)"


def test_printed_shape_with_uneven_samples():
    rows = scenario_rows("a", 1, 4) + scenario_rows("b", 1, 3) + scenario_rows("c", 0, 2)
    result = pass_at(rows)
    assert result.samples_per_prompt is None
    assert str(result).endswith("(n=3 scenarios, 3 prompts, 9 samples)")


def test_marker_value_gives_a_tool_call_rate():
    rows = [graded("a", 0, tool_call=1), graded("b", 1, tool_call=0),
            graded("c", 1, tool_call=1), graded("d", 0, tool_call=1)]
    result = pass_at(rows, value="marker:tool_call")
    assert result.pass_at_1 == 0.75
    assert result.label == "tool_call"
    assert str(result).startswith("tool_call 0.75 ")


def test_callable_value():
    rows = [graded("a", 1), graded("b", 0), graded("c", 1)]
    result = pass_at(rows, value=lambda row: row["score"] * 0.5)
    assert result.pass_at_1 == pytest.approx(1 / 3)


def test_missing_marker_names_the_row():
    rows = [graded("a", 1), {**graded("b", 0), "markers": {}}]
    with pytest.raises(ValueError, match=r"row 1 \(scenario 'b'\) has no marker 'tool_call'"):
        pass_at(rows, value="marker:tool_call")


def test_scenario_falls_back_to_the_prompt_text():
    rows = [{**graded("x", 1), "scenario_id": None, "prompt": "p1"},
            {**graded("x", 0), "scenario_id": None, "prompt": "p2"}]
    assert pass_at(rows).per_scenario == {"p1": 1.0, "p2": 0.0}


def test_a_constant_result_is_called_out():
    rows = [graded(f"s{i}", 0) for i in range(25)]
    assert "every row scored 0 (25 of 25)" in pass_at(rows).note


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no rows"):
        pass_at([])
    with pytest.raises(ValueError, match="k must be at least 1"):
        pass_at([graded("a", 1)], k=0)


def test_to_dict_is_json_safe():
    rows = [r for i in range(5) for r in scenario_rows(f"s{i}", i % 4, 4)]
    data = pass_at(rows).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert isinstance(data["ci95"], list) and data["n_scenarios"] == 5
