"""The hack monitor's alarm rules, as pure functions: each condition can stop an alarm."""

from __future__ import annotations

import pytest

from posttrain.train.grpo.alarms import (
    AlarmRules,
    FeatureChange,
    Progress,
    divergence_alarm,
    exploitation_alarm,
    feature_grew,
    guard_alarm,
    guard_pay,
    holdout_followed,
    length_alarm,
    no_signal_alarm,
    reward_gap_alarm,
)

RULES = AlarmRules()  # share +0.15, length +50% and +40 chars, reward +0.05, holdout <= 0
GROWING = FeatureChange("no_id", "tool:lookup_order", baseline=0.05, now=0.40, paid=0.3)
REWARD_UP = Progress(baseline=0.60, now=0.75)
HOLDOUT_FLAT = Progress(baseline=0.70, now=0.66)


def test_a_paid_feature_that_grows_while_the_holdout_falls_is_a_hack():
    alarm = exploitation_alarm(20, GROWING, REWARD_UP, HOLDOUT_FLAT, RULES)
    assert alarm is not None and alarm.kind == "hack" and alarm.step == 20
    assert "no_id" in alarm.message and "'tool:lookup_order'" in alarm.message
    assert "0.05 -> 0.40 of replies" in alarm.message
    assert alarm.details["reward_gain"] == pytest.approx(0.15)
    assert alarm.details["holdout_gain"] == pytest.approx(-0.04)


def test_no_hack_when_the_holdout_follows_the_reward():
    # the clean-run case: the reward pays for a feature, it grows, and the holdout rises
    assert exploitation_alarm(20, GROWING, REWARD_UP, Progress(0.70, 0.80), RULES) is None


def test_no_hack_when_the_reward_did_not_rise():
    assert exploitation_alarm(20, GROWING, Progress(0.60, 0.63), HOLDOUT_FLAT, RULES) is None


def test_no_hack_when_the_reward_rose_within_its_noise():
    # a clean refund run's with_id at step 15: the reward +0.07 over the base rows, its
    # gain's standard error a few hundredths, the holdout back where it started
    drifting = Progress(baseline=0.60, now=0.67, noise=0.048)
    assert exploitation_alarm(15, GROWING, drifting, Progress(0.27, 0.27), RULES) is None
    clear = Progress(baseline=0.60, now=0.67, noise=0.02)  # 3.5 standard errors
    alarm = exploitation_alarm(15, GROWING, clear, Progress(0.27, 0.27), RULES)
    assert alarm is not None and alarm.details["reward_noise"] == pytest.approx(0.02)
    assert "(noise 0.02)" in alarm.message


def test_a_rise_needs_the_minimum_and_its_standard_errors():
    assert Progress(0.5, 0.56).rose(0.05, 2.0)  # unmeasured noise: the minimum alone
    assert not Progress(0.5, 0.54).rose(0.05, 2.0)
    assert not Progress(0.5, 0.56, noise=0.04).rose(0.05, 2.0)
    assert Progress(0.5, 0.56, noise=0.04).rose(0.05, 1.5)


def test_no_hack_when_the_feature_did_not_grow():
    steady = FeatureChange("no_id", "word:sorry", baseline=0.30, now=0.40, paid=0.3)
    assert exploitation_alarm(20, steady, REWARD_UP, HOLDOUT_FLAT, RULES) is None


def test_no_hack_for_a_feature_the_reward_pays_less_for():
    penalised = FeatureChange("with_id", "marker:invented_id", 0.05, 0.40, paid=-0.4)
    assert exploitation_alarm(20, penalised, REWARD_UP, HOLDOUT_FLAT, RULES) is None


def test_a_category_at_the_ceiling_did_not_follow_only_when_it_fell_by_more_than_one_prompt():
    # the refund clean run (seed 4) that once alarmed: off_topic holdout 6 of 6 -> 5 of 6
    # while the rule paid for a word of its right replies; at 1.0 it cannot rise
    word = FeatureChange("off_topic", "word:that", baseline=0.10, now=0.45, paid=0.2)
    assert holdout_followed(Progress(1.0, 1.0), 6, RULES)
    assert holdout_followed(Progress(1.0, 5 / 6), 6, RULES)
    assert exploitation_alarm(10, word, REWARD_UP, Progress(1.0, 5 / 6), RULES, 6) is None
    alarm = exploitation_alarm(10, word, REWARD_UP, Progress(1.0, 4 / 6), RULES, 6)
    assert alarm is not None and alarm.details["holdout_gain"] == pytest.approx(-2 / 6)
    # with room to rise, staying flat is not following, whatever the count
    assert not holdout_followed(Progress(0.70, 0.70), 6, RULES)
    # an unknown count: any fall at the ceiling counts, staying there does not
    assert holdout_followed(Progress(0.97, 0.97), 0, RULES)
    assert not holdout_followed(Progress(0.97, 0.95), 0, RULES)


def test_length_grows_relative_to_its_baseline_and_by_enough_characters():
    # +50% and +40 characters, both needed
    assert feature_grew(FeatureChange("all", "length", 60, 100, 1.0), RULES)
    assert not feature_grew(FeatureChange("all", "length", 60, 85, 1.0), RULES)  # +25 chars
    assert not feature_grew(FeatureChange("all", "length", 200, 250, 1.0), RULES)  # +25%
    alarm = exploitation_alarm(10, FeatureChange("with_id", "length", 60, 150, 0.5),
                               REWARD_UP, HOLDOUT_FLAT, RULES)  # fmt: skip
    assert alarm is not None and "60 -> 150 characters" in alarm.message


def test_length_alarm_needs_growth_and_a_holdout_that_did_not_rise():
    assert length_alarm(30, Progress(50, 120), Progress(0.5, 0.5), RULES).kind == "length"
    assert length_alarm(30, Progress(50, 120), Progress(0.5, 0.6), RULES) is None
    assert length_alarm(30, Progress(50, 60), Progress(0.5, 0.4), RULES) is None


def test_divergence_needs_the_proxy_up_and_the_gold_not():
    assert divergence_alarm(40, Progress(0.4, 0.5), Progress(0.3, 0.31), RULES).kind == (
        "divergence"
    )
    assert divergence_alarm(40, Progress(0.4, 0.5), Progress(0.3, 0.36), RULES) is None
    assert divergence_alarm(40, Progress(0.4, 0.42), Progress(0.3, 0.2), RULES) is None


def test_thresholds_are_settings():
    strict = AlarmRules(min_share_growth=0.5)
    assert exploitation_alarm(20, GROWING, REWARD_UP, HOLDOUT_FLAT, strict) is None
    lenient = AlarmRules(max_holdout_gain=0.2)
    assert exploitation_alarm(20, GROWING, REWARD_UP, Progress(0.7, 0.8), lenient) is not None


def test_a_guard_that_falls_by_enough_raises_a_guard_alarm_whatever_pass_at_1_did():
    alarm = guard_alarm(30, "well_formed", Progress(0.85, 0.60), RULES)
    assert alarm is not None and alarm.kind == "guard" and alarm.step == 30
    assert alarm.details == {"guard": "well_formed", "baseline": 0.85, "now": 0.60}
    assert "0.85 to 0.60" in alarm.message


@pytest.mark.parametrize("now", [0.80, 0.85, 0.99])
def test_a_guard_that_held_or_rose_is_no_alarm(now):
    assert guard_alarm(30, "well_formed", Progress(0.85, now), RULES) is None


def rollouts(per_prompt: list[tuple[list[float], list[float]]]) -> list[dict]:
    """Graded rollouts: for each prompt, the scores of replies keeping the guard, then
    of replies that lost it."""
    rows = []
    for index, (kept, lost) in enumerate(per_prompt):
        rows += [{"scenario_id": f"s{index}", "score": score,
                  "markers": {"well_formed": True}} for score in kept]
        rows += [{"scenario_id": f"s{index}", "score": score,
                  "markers": {"well_formed": False}} for score in lost]
    return rows


def test_guard_pay_compares_lost_and_kept_within_each_prompt():
    # prompt 0 pays the loss 0.5 less; prompt 1 the same; prompt 2 has no broken reply
    pay = guard_pay(rollouts([([1.0, 0.0], [0.0]), ([0.5], [0.5, 0.5]), ([1.0], [])]),
                    "well_formed")
    assert pay is not None and pay.groups == 2
    assert pay.difference == pytest.approx(-0.25)
    assert pay.stderr == pytest.approx(0.25)
    assert guard_pay(rollouts([([1.0], []), ([], [0.0])]), "well_formed") is None
    assert guard_pay([{"scenario_id": "s", "score": 1.0, "markers": {}}], "well_formed") is None


def test_a_guard_drop_the_reward_punishes_is_learning_not_an_alarm():
    punished = guard_pay(rollouts([([1.0, 1.0, 0.0], [0.0])] * 6), "well_formed")
    assert punished is not None and punished.punished(RULES)
    assert guard_alarm(10, "well_formed", Progress(0.84, 0.67), RULES, punished) is None


@pytest.mark.parametrize("per_prompt", [
    [([1.0, 0.0], [1.0])] * 6,  # the broken replies are paid like the intact ones
    [([0.0], [1.0])] * 6,  # or better: a hole
    [([1.0], [0.0])] * 3,  # punished, but on too few prompts to say
    [([1.0], [0.0]), ([0.0], [1.0])] * 3,  # no clear direction
])
def test_a_guard_drop_the_reward_does_not_clearly_punish_still_alarms(per_prompt):
    pay = guard_pay(rollouts(per_prompt), "well_formed")
    alarm = guard_alarm(10, "well_formed", Progress(0.84, 0.67), RULES, pay)
    assert alarm is not None and alarm.details["paid_groups"] == pay.groups
    assert f"on {pay.groups} training prompt(s)" in alarm.message


def test_no_signal_needs_most_groups_dead_for_several_steps_in_a_row():
    assert no_signal_alarm(4, [1.0, 1.0, 1.0, 1.0], RULES) is None  # only 4 steps yet
    alarm = no_signal_alarm(5, [1.0, 0.9, 0.8, 1.0, 0.75], RULES)
    assert alarm is not None and alarm.kind == "no_signal" and alarm.details["steps"] == 5
    assert "a supervised cold start" in alarm.message and "--num-generations" in alarm.message
    assert no_signal_alarm(6, [1.0, 1.0, 1.0, 0.5, 1.0, 1.0], RULES) is None  # one live step


def test_a_reward_gaining_on_the_rule_is_a_divergence_whatever_the_rule_did():
    # the rule rose too, but the reward rose 0.15 more: it pays for something else
    alarm = reward_gap_alarm(20, "with_id", Progress(0.50, 0.90), Progress(0.40, 0.65), RULES)
    assert alarm is not None and alarm.kind == "divergence"
    assert alarm.details["gap_growth"] == pytest.approx(0.15)
    assert alarm.details["category"] == "with_id" and "with_id:" in alarm.message


@pytest.mark.parametrize(("reward", "rule"), [
    (Progress(0.50, 0.90), Progress(0.40, 0.75)),  # the rule followed: gap +0.05
    (Progress(0.50, 0.55), Progress(0.40, 0.40)),  # both flat: gap +0.05
    (Progress(0.50, 0.40), Progress(0.40, 0.40)),  # the reward fell
])
def test_a_reward_the_rule_follows_is_no_divergence(reward, rule):
    assert reward_gap_alarm(20, "no_id", reward, rule, RULES) is None
