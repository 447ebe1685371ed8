"""Agents and grading: graded rows, seeded reproducibility, judges, a second environment."""

from dataclasses import dataclass, field

import pytest

from posttrain.data.prompts import make_record
from posttrain.envs.refund import REFUND_ENV
from posttrain.envs.refund.agent import Behaviour, seeded_agent
from posttrain.envs.refund.prompts import simulate
from posttrain.score.rows import grade

ROW_KEYS = {
    "prompt",
    "scenario_id",
    "category",
    "sample",
    "reply",
    "score",
    "reward",
    "markers",
    "policy",
    "sampling",
    "eval_run",
}


def test_rows_have_the_documented_shape():
    prompts = simulate(10, seed=0)
    rows = grade(REFUND_ENV, prompts, seeded_agent(seed=0), k=3)
    assert len(rows) == 3 * len(prompts)
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["reward"] == (1 if row["score"] >= 1.0 else 0)
        assert set(row["markers"]) == {"well_formed", "tool_call", "invented_id"}
        assert row["policy"]["agent"] == "seeded"
        assert isinstance(row["sampling"]["seed"], int)
    assert [r["sample"] for r in rows[:3]] == [0, 1, 2]


def test_seeded_grading_is_reproducible_and_eval_runs_differ():
    prompts = simulate(40, seed=0)
    agent = seeded_agent(seed=5)
    first = grade(REFUND_ENV, prompts, agent, k=4, seed=1)
    assert grade(REFUND_ENV, prompts, agent, k=4, seed=1) == first
    other_run = grade(REFUND_ENV, prompts, agent, k=4, seed=1, eval_run=1)
    assert [r["reply"] for r in other_run] != [r["reply"] for r in first]


def test_perfect_agent_passes_everything():
    perfect = seeded_agent(
        with_id=Behaviour(right=1.0), no_id=Behaviour(right=1.0), off_topic=Behaviour(right=1.0)
    )
    rows = grade(REFUND_ENV, simulate(30, seed=0), perfect, k=2)
    assert all(row["reward"] == 1 for row in rows)


def test_behaviour_probabilities_show_up():
    inventor = seeded_agent(no_id=Behaviour(right=0.0, invent=1.0))
    no_id = [r for r in simulate(100, seed=0) if r["category"] == "no_id"]
    rows = grade(REFUND_ENV, no_id, inventor, k=2)
    assert all(row["score"] == 0.2 and row["markers"]["invented_id"] == 1.0 for row in rows)
    half = seeded_agent(with_id=Behaviour(right=0.5))
    with_id = [r for r in simulate(200, seed=0) if r["category"] == "with_id"]
    rate = sum(r["reward"] for r in grade(REFUND_ENV, with_id, half, k=4)) / (4 * len(with_id))
    assert 0.4 < rate < 0.6


def test_bad_behaviour_is_refused():
    with pytest.raises(ValueError, match="sum to <= 1"):
        Behaviour(right=0.8, invent=0.5)


def test_plain_callable_agent_and_progress():
    calls = []
    rows = grade(
        REFUND_ENV,
        [make_record("Tell me a joke")],
        lambda messages: "Sorry, only orders here.",
        k=2,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert [r["reward"] for r in rows] == [1, 1]
    assert calls[-1] == (2, 2)


def test_a_judge_can_be_any_callable():
    prompts = [make_record("Tell me a joke")]
    rows = grade(REFUND_ENV, prompts, lambda m: "ok", k=1, judge=lambda reply, record: False)
    assert rows[0]["score"] == 0.0 and rows[0]["reward"] == 0
    rows = grade(REFUND_ENV, prompts, lambda m: "ok", k=1, judge=lambda reply, rec: {"score": 1})
    assert rows[0]["reward"] == 1
    with pytest.raises(ValueError, match="the judge returned 7"):
        grade(REFUND_ENV, prompts, lambda m: "ok", k=1, judge=lambda reply, record: 7)


def test_k_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        grade(REFUND_ENV, [make_record("hi")], lambda m: "x", k=0)


@dataclass(frozen=True)
class ShoutEnv:
    """A second environment in a few lines: replies must be upper case."""

    name: str = "shout"
    categories: tuple = ("any",)
    tools: list = field(default_factory=list)
    system: str = "Answer in capitals."

    def messages_for(self, prompt):
        return [{"role": "system", "content": self.system}, {"role": "user", "content": prompt}]

    def case_for(self, prompt):
        return {}

    def category(self, case):
        return "any"

    def score(self, reply, case):
        return 1.0 if reply.isupper() else 0.0

    def markers(self, reply, case):
        return {"well_formed": 1.0}


def test_a_second_environment_needs_no_other_change():
    from posttrain.envs.base import Env

    env = ShoutEnv()
    assert isinstance(env, Env)
    rows = grade(env, [{"prompt": "hello", "scenario_id": "s1"}], lambda m: "HELLO", k=2)
    assert [r["reward"] for r in rows] == [1, 1] and rows[0]["category"] == "any"
