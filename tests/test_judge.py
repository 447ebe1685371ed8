"""A model judge beside the rule: verdict parsing, the judge-vs-rule table, `posttrain eval
--judge-endpoint` against a judge server of the test's own (deterministic verdicts) and
against a live `posttrain serve`, and `posttrain grpo --gold-endpoint` feeding the hack
monitor's gold score."""

from __future__ import annotations

import json
import re

import pytest
from chat_servers import ChatHandler, completion, serving

from posttrain.cli import main
from posttrain.policy.judge import Agreement, agreement, parse_verdict


def test_verdicts_are_the_first_pass_or_fail_said():
    assert parse_verdict("PASS") is True and parse_verdict("fail.") is False
    assert parse_verdict("Verdict: Pass, not fail") is True
    assert parse_verdict("FAILED? passable") is None  # whole words only
    assert parse_verdict("") is None


def test_the_table_counts_each_cell_and_skips_rows_without_a_verdict():
    rows = [{"reward": r} for r in (1, 1, 1, 0, 0, 0, 0, 1)]
    verdicts = [True, True, False, True, False, False, None, None]
    table = agreement(rows, verdicts)
    assert table == Agreement(both_pass=2, rule_pass_judge_fail=1, rule_fail_judge_pass=1,
                              both_fail=2, no_verdict=2)
    assert table.judged == 6 and table.agreement == pytest.approx(4 / 6)
    # chance agreement: rule passes 3/6, judge passes 3/6 -> 0.5; kappa (0.667-0.5)/0.5
    assert table.kappa == pytest.approx((4 / 6 - 0.5) / 0.5)
    text = table.format()
    assert "6 replies judged, 2 without a verdict" in text and "kappa 0.33" in text
    assert Agreement(3, 0, 0, 0, 0).kappa is None  # one answer only: undefined


class ToolCallJudge(ChatHandler):
    """PASS when the judged reply holds a tool call, FAIL otherwise."""

    model = "judge"
    asked = 0

    def do_POST(self):
        type(self).asked += 1
        question = self.body()["messages"][-1]["content"]
        reply = re.search(r"Assistant's reply:\n(.*)\n\nDoes the reply", question, re.S).group(1)
        self.send_json(completion("judge", "PASS" if "<tool_call>" in reply else "FAIL"))


@pytest.fixture
def judge_url():
    ToolCallJudge.asked = 0
    with serving(ToolCallJudge) as url:
        yield url


def test_eval_puts_the_judge_beside_the_rule(judge_url, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["eval", "--prompts", "40", "--samples", "2", "--judge-endpoint", judge_url,
                 "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert ToolCallJudge.asked == len(rows)
    assert all(row["judge"] == ("<tool_call>" in row["reply"]) for row in rows)
    expected = agreement(rows, [row["judge"] for row in rows])
    assert summary["judge"] == expected.to_dict()
    assert expected.judged == len(rows) and expected.no_verdict == 0
    assert main(["eval", "--prompts", "40", "--samples", "1", "--judge-endpoint",
                 judge_url]) == 0
    assert "judge vs rule" in capsys.readouterr().out


@pytest.mark.slow
def test_a_model_behind_posttrain_serve_as_the_judge(starter_2m_folder, tmp_path, capsys):
    """The plumbing end to end with a real model as judge: the tiny starter is no judge
    (it rarely says PASS or FAIL), and the table says how many it left without a verdict."""
    from posttrain.policy.loading import load_policy
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    engine = Engine("starter-2m", tmp_path / "state", torch_threads=1,
                    policy=load_policy("starter-2m", device="cpu", show_progress=False))
    running = start_server(engine, port=0)
    try:
        assert main(["eval", "--prompts", "30", "--samples", "1", "--json",
                     "--judge-endpoint", running.url + "/v1"]) == 0
    finally:
        running.stop()
    table = json.loads(capsys.readouterr().out)["judge"]
    counted = sum(table[key] for key in ("both_pass", "rule_pass_judge_fail",
                                         "rule_fail_judge_pass", "both_fail", "no_verdict"))
    assert counted > 0


def test_gold_needs_the_monitor_and_a_reachable_judge(tmp_path, judge_url, capsys):
    runs = tmp_path / "runs"
    assert main(["grpo", "--gold-endpoint", judge_url, "--monitor-every", "0",
                 "--runs-dir", str(runs)]) == 2
    assert "needs --monitor-every above 0" in capsys.readouterr().err
    assert main(["grpo", "--gold-endpoint", judge_url, "--gold-model", "nobody",
                 "--runs-dir", str(runs)]) == 2
    assert "does not serve 'nobody'" in capsys.readouterr().err
    assert not runs.exists()


@pytest.mark.slow
def test_grpo_logs_the_judges_gold_score_at_every_check(starter_2m_folder, judge_url,
                                                        tmp_path):
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "60", "--steps", "2",
                 "--num-generations", "4", "--eval-samples", "1", "--eval-repeats", "1",
                 "--monitor-every", "1", "--gold-endpoint", judge_url, "--stop-on",
                 "divergence", "--run-name", "gold", "--runs-dir", str(runs)])
    assert code in (0, 1)
    summary = json.loads((runs / "gold" / "summary.json").read_text())
    checks = summary["monitor"]["checks"]
    assert checks and all(0.0 <= check["gold"] <= 1.0 for check in checks)
    logged = [json.loads(line)["metrics"] for line in (runs / "gold" / "metrics.jsonl").open()]
    assert sum("monitor/gold" in metrics for metrics in logged) == len(checks)
    assert ToolCallJudge.asked >= len(checks)  # the judge saw each check's replies
