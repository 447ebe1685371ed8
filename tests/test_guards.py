"""The verdict's guards (posttrain.score.guards): the default where it can fail on the
baseline rows, else a marker the rule scores one way everywhere, guarded so that its fall
fails the run."""

from __future__ import annotations

from posttrain.score.delta import RUN_GUARDS, run_verdict
from posttrain.score.guards import choose_guards, marker_direction


def row(category: str, n: int, score: float, *, well_formed: float = 1.0,
        tool_call: float = 0.0, invented_id: float = 0.0, eval_run: int = 0) -> dict:
    return {"category": category, "scenario_id": f"{category}-{n}", "prompt": f"{category} {n}",
            "eval_run": eval_run, "score": score, "reward": 1 if score == 1.0 else 0,
            "markers": {"well_formed": well_formed, "tool_call": tool_call,
                        "invented_id": invented_id}}


def cold_started(n: int, eval_run: int = 0, invent: bool = False) -> list[dict]:
    """Replies of a policy that calls the tool: right with an id (asking again is the
    lesser mistake there), wrong without one (the id is invented); well_formed 1.0."""
    return [
        row("with_id", n, 1.0, tool_call=1.0, eval_run=eval_run),
        row("with_id", n + 100, 0.3, eval_run=eval_run),
        row("no_id", n, 0.2, tool_call=1.0, invented_id=1.0, eval_run=eval_run),
        row("no_id", n + 100, 0.2 if invent else 1.0, tool_call=1.0 if invent else 0.0,
            invented_id=1.0 if invent else 0.0, eval_run=eval_run),
    ]


def test_a_default_guard_that_varies_is_kept_alone():
    rows = [row("with_id", 0, 1.0, tool_call=1.0), row("with_id", 1, 0.0, well_formed=0.0)]
    choice = choose_guards(rows, RUN_GUARDS)
    assert choice.names == ["well_formed"] and choice.notes == []


def test_a_constant_guard_brings_a_marker_the_rule_scores_one_way():
    rows = [r for n in range(6) for r in cold_started(n)]
    # invented ids score less in both categories; a tool call scores more with an id and
    # less without one: no direction on its own
    assert marker_direction(rows, "invented_id") == -1
    assert marker_direction(rows, "tool_call") == 0
    choice = choose_guards(rows, RUN_GUARDS)
    assert choice.names == ["well_formed", "not:invented_id"]
    assert "well_formed is 1.00 on every baseline reply" in choice.notes[0]
    assert "guarding also: not:invented_id" in choice.notes[1]


def test_nothing_that_can_fail_is_said():
    base = [row("with_id", n, 0.0) for n in range(4)] + [row("no_id", n, 0.2)
                                                        for n in range(4)]
    choice = choose_guards(base, RUN_GUARDS)
    assert choice.names == ["well_formed"]  # 1.00 everywhere: it can still fall
    assert "no guard can fail in this run" in choice.notes[-1]
    zero = [row("with_id", n, 0.0, well_formed=0.0) for n in range(3)]
    dropped = choose_guards(zero, RUN_GUARDS)
    assert dropped.names == [] and "cannot fall: not checked" in dropped.notes[0]


def test_the_verdict_fails_a_run_whose_replies_invent_more_ids():
    before = [r for run in (0, 1) for n in range(8) for r in cold_started(n, eval_run=run)]
    after = [r for n in range(8) for r in cold_started(n, invent=True)]
    report = run_verdict(before, after)
    guards = {guard.name: guard for guard in report.guards}
    assert set(guards) == {"well_formed", "not:invented_id"}
    assert guards["not:invented_id"].before == 0.75 and guards["not:invented_id"].after == 0.5
    assert guards["not:invented_id"].fell and not guards["well_formed"].fell
    assert not report.ok and "guard not:invented_id fell" in report.warnings
    assert any("guarding also: not:invented_id" in w for w in report.warnings)
    # the same rows the other way round: fewer invented ids, the guard holds
    assert not run_verdict(after, before, guards=("not:invented_id",)).guards[0].fell
    # named guards are checked as named, with no choice made
    assert [g.name for g in run_verdict(before, after, guards=("well_formed",)).guards] == [
        "well_formed"]


def library_like(n: int, eval_run: int = 0, spread: bool = False) -> list[dict]:
    """A tool call is paid on a loan and a failure on chitchat (the library rule's shape):
    no direction across categories, a clear one within each. ``spread``: the policy calls
    the tool on chitchat too."""
    return [
        row("loan", n, 1.0, tool_call=1.0, eval_run=eval_run),
        row("loan", n + 100, 0.0, eval_run=eval_run),
        row("chitchat", n, 0.0 if spread else 1.0, tool_call=1.0 if spread else 0.0,
            eval_run=eval_run),
        row("chitchat", n + 100, 0.0, tool_call=1.0, eval_run=eval_run),
    ]


def test_a_marker_scored_one_way_within_a_category_guards_that_category():
    rows = [r for n in range(6) for r in library_like(n)]
    assert marker_direction(rows, "tool_call") == 0
    choice = choose_guards(rows, RUN_GUARDS)
    assert choice.names == ["well_formed", "tool_call@loan", "not:tool_call@chitchat"]
    assert "guarding per category" in choice.notes[-1]
    before = [r for run in (0, 1) for n in range(8) for r in library_like(n, eval_run=run)]
    after = [r for n in range(8) for r in library_like(n, spread=True)]
    report = run_verdict(before, after)
    guards = {guard.name: guard for guard in report.guards}
    # chitchat's tool calls went from half of its replies to all of them: that guard falls,
    # read on chitchat's rows only; the loan guard holds
    assert guards["not:tool_call@chitchat"].before == 0.5
    assert guards["not:tool_call@chitchat"].after == 0.0 and guards["not:tool_call@chitchat"].fell
    assert not guards["tool_call@loan"].fell and guards["tool_call@loan"].n_paired == 16
    assert not report.ok and "guard not:tool_call@chitchat fell" in report.warnings
