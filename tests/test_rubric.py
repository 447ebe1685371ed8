"""The reward pipeline (posttrain.score.rubric): one definition of the reward and of the
group advantages, used by the TRL recipe's reward function and by the service's RL loop."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.score import rubric as core
from posttrain.score.rubric import (
    RewardTerm,
    Rubric,
    group_mean_advantages,
    leave_one_out_advantages,
    rule_rubric,
    training_rubric,
    trl_scale_rewards,
)
from posttrain.service.client import algorithms, rl
from posttrain.train.rewards import RuleReward

ROOT = Path(__file__).resolve().parents[1]
REFUND = get_env("refund")
LOOKUP = ('<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-4017"}}'
          "\n</tool_call>")


def test_the_rule_rubric_is_the_environments_score_unchanged():
    case = REFUND.case_for("Refund ORD-4017 please")
    rubric = rule_rubric(REFUND)
    for reply in (LOOKUP, "Sure, done!", ""):
        assert rubric.score(reply, case) == REFUND.score(reply, case)
    assert rubric.name == "rule"


def test_a_weighted_rubric_sums_its_terms():
    rubric = Rubric((RewardTerm("rule", REFUND.score, 0.5),
                     RewardTerm("short", lambda reply, case: float(len(reply) < 20), 2.0)))
    case = REFUND.case_for("Refund ORD-4017 please")
    # the lookup passes the rule (1.0) and is long: 0.5 * 1.0 + 2.0 * 0.0
    assert rubric.score(LOOKUP, case) == 0.5
    assert rubric.term_values("ok", case) == {"rule": REFUND.score("ok", case), "short": 1.0}
    assert rubric.name == "rubric"


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", None, True])
def test_a_reward_function_must_return_a_finite_number(bad):
    rubric = training_rubric(REFUND, lambda reply, case: bad)
    with pytest.raises(PosttrainError, match="must return a finite number"):
        rubric.score("x", {})


def test_a_reward_function_that_raises_is_one_line_naming_it():
    def broken(reply, case):
        return case["order_id"]  # a KeyError on a case without one

    rubric = training_rubric(REFUND, broken)
    with pytest.raises(PosttrainError, match="the training reward raised KeyError on a "
                                             "reply: 'order_id'"):
        rubric.score("x", {})


def test_a_rubric_needs_a_term_and_finite_weights():
    with pytest.raises(ValueError, match="at least one"):
        Rubric(())
    with pytest.raises(ValueError, match="not a finite number"):
        Rubric((RewardTerm("rule", REFUND.score, math.nan),))


def test_the_trl_reward_function_scores_through_the_rubric():
    reward = RuleReward(REFUND)
    assert reward.__name__ == "rule" and reward.rubric == rule_rubric(REFUND)
    scores = reward([[{"role": "assistant", "content": LOOKUP}]],
                    prompt_text=["Refund ORD-4017 please"], scenario_id=["s"])
    assert scores == [REFUND.score(LOOKUP, REFUND.case_for("Refund ORD-4017 please"))]
    custom = RuleReward(REFUND, lambda reply, case: 0.25)
    assert custom.__name__ == "reward" and custom.score_reply("x", {}) == 0.25


def test_group_advantages_pinned():
    # r - mean over the population std: [0, 0, 1, 1] has mean 0.5 and std 0.5
    assert group_mean_advantages([0.0, 0.0, 1.0, 1.0]) == [-1.0, -1.0, 1.0, 1.0]
    assert group_mean_advantages([0.0, 0.0, 1.0, 1.0], normalize_std=False) == [
        -0.5, -0.5, 0.5, 0.5]
    assert group_mean_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]  # no division by zero
    # RLOO: G / (G - 1) times the centred reward
    assert leave_one_out_advantages([0.0, 1.0]) == [-1.0, 1.0]


def test_trls_advantage_differs_by_the_bessel_factor_only():
    # TRL divides by the sample std (G - 1) plus 1e-4: for G = 8 the advantages are
    # sqrt(7/8) = 0.935 times these (the module docstring's statement, checked here)
    torch = pytest.importorskip("torch")
    rewards = [0.0, 0.2, 1.0, 1.0, 0.0, 0.3, 1.0, 0.2]
    ours = group_mean_advantages(rewards)
    tensor = torch.tensor(rewards, dtype=torch.float64)
    trls = ((tensor - tensor.mean()) / (tensor.std() + 1e-4)).tolist()
    for mine, theirs in zip(ours, trls, strict=True):
        assert theirs == pytest.approx(mine * math.sqrt(7 / 8), rel=1e-3)
    assert trl_scale_rewards(True) == "group" and trl_scale_rewards(False) == "none"


def test_the_service_uses_the_same_advantages():
    assert rl.group_mean_advantages is core.group_mean_advantages
    assert rl.leave_one_out_advantages is core.leave_one_out_advantages
    assert algorithms.group_mean_advantages is core.group_mean_advantages


def test_the_pipeline_is_defined_once():
    pattern = re.compile(r"^def (group_mean_advantages|leave_one_out_advantages|all_zero|"
                         r"rule_rubric|training_rubric)\(", re.MULTILINE)
    defined = [path.relative_to(ROOT).as_posix() for path in (ROOT / "posttrain").rglob("*.py")
               for _ in pattern.finditer(path.read_text())]
    assert sorted(set(defined)) == ["posttrain/score/rubric.py"]
    assert len(defined) == 5
