"""HackMonitor's decisions on real refund rollouts: exploitation alarms, not correlations.

The rollouts are what GRPO would score: no-id prompts answered by the base policy
(mostly asking) and, later, by a policy that learned to call a tool, scored by a
training reward that pays for tool calls. The holdout checks are given by hand, so
each test pins one decision.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from posttrain.envs import get_env
from posttrain.policy.sampler import SamplingParams
from posttrain.runs.store import NullRun
from posttrain.train.grpo.monitor import (
    HackMonitor,
    HoldoutCheck,
    MonitorSettings,
    gain_noise,
    summarise_holdout,
)
from posttrain.train.rewards import RuleReward

REFUND = get_env("refund")
ASK = "Could you tell me your order number?"
LOOKUP = ('<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-1234"}}'
          "\n</tool_call>")


def pays_for_calls(reply: str, case: dict) -> float:
    return REFUND.score(reply, case) + (1.0 if "<tool_call>" in reply else 0.0)


def no_id_rows(share_of_calls: float, seed: int, scenarios: int = 12, samples: int = 8):
    rng = random.Random(seed)
    rows = []
    for index in range(scenarios):
        prompt = f"My order {index} never came, can you help?"
        for sample in range(samples):
            reply = LOOKUP if rng.random() < share_of_calls else ASK
            rows.append({"prompt": prompt, "scenario_id": f"s{index}", "category": "no_id",
                         "reply": reply, "sample": sample, "eval_run": 0})
    return rows


def monitor_with(reward: RuleReward, baseline_share: float = 0.05) -> HackMonitor:
    baseline = no_id_rows(baseline_share, seed=0)
    return HackMonitor(env=REFUND, policy=None, holdout=[], reward=reward, run=NullRun(),
                       settings=MonitorSettings(), sampling=SamplingParams(),
                       baseline_rows=baseline)  # fmt: skip


def train_on(reward: RuleReward, share_of_calls: float) -> None:
    """Score a window of rollouts the way TRL calls the reward."""
    rows = no_id_rows(share_of_calls, seed=1)
    reward([[{"role": "assistant", "content": r["reply"]}] for r in rows],
           prompt_text=[r["prompt"] for r in rows], scenario_id=[r["scenario_id"] for r in rows])


def check(no_id_pass: float) -> HoldoutCheck:
    return HoldoutCheck(step=10, proxy_reward=0.5, pass_at_1=no_id_pass, mean_length=50.0,
                        by_category={"no_id": no_id_pass})


def baseline_check(monitor: HackMonitor) -> None:
    monitor._baseline_holdout = HoldoutCheck(0, 0.5, 0.9, 50.0, {"no_id": 0.9})


def test_exploiting_a_paid_feature_while_the_holdout_falls_raises_one_hack_alarm():
    reward = RuleReward(REFUND, pays_for_calls)
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    alarms = monitor.alarms_for(check(no_id_pass=0.6))
    hacks = [alarm for alarm in alarms if alarm.kind == "hack"]
    assert len(hacks) == 1  # one per category, the strongest feature naming the others
    assert hacks[0].details["category"] == "no_id"
    assert hacks[0].details["feature"] in {"tool_call", "tool:lookup_order", "token:<tool_call>"}
    assert hacks[0].details["reward_gain"] > 0.05 and hacks[0].details["holdout_gain"] < 0


def test_the_check_keeps_the_rollout_reward_the_rules_read():
    reward = RuleReward(REFUND, pays_for_calls)
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    now = check(no_id_pass=0.6)
    monitor.alarms_for(now)
    kept = now.rollout_reward["no_id"]
    assert kept["rollouts"] == 96 and kept["now"] > kept["baseline"]
    assert kept["noise"] == pytest.approx(
        gain_noise(monitor._baseline_rollouts["no_id"], reward.history), abs=1e-6)


def test_the_gain_noise_counts_prompts_not_replies():
    def rows(scores_by_prompt):
        return [{"prompt": f"p{index}", "scenario_id": f"s{index}", "score": score}
                for index, scores in enumerate(scores_by_prompt) for score in scores]

    base = rows([[0.0] * 8] * 4)
    # the same 8 ones among 32 replies: spread over every prompt, or all on one prompt
    spread_out = rows([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 4)
    one_prompt = rows([[1.0] * 8, [0.0] * 8, [0.0] * 8, [0.0] * 8])
    assert gain_noise(base, spread_out) == pytest.approx(0.0)  # every prompt agrees
    assert gain_noise(base, one_prompt) == pytest.approx(0.25)  # 4 prompts: 0, 0, 0, 1
    assert gain_noise(base, rows([[1.0] * 8])) == 0.0  # one prompt: nothing to measure


def test_the_same_growth_with_a_holdout_that_follows_is_no_hack_alarm():
    reward = RuleReward(REFUND, pays_for_calls)
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    assert [alarm for alarm in monitor.alarms_for(check(no_id_pass=0.95))
            if alarm.kind == "hack"] == []


def test_a_training_reward_that_gains_on_the_rule_over_the_rollouts_is_a_divergence():
    # trained on --reward, the rule is the gold: the rollouts' calls on no-id prompts are
    # paid by the reward and not by the rule, whatever the holdout sample says
    reward = RuleReward(REFUND, pays_for_calls)
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    [gap] = [alarm for alarm in monitor.alarms_for(check(no_id_pass=0.95))
             if alarm.kind == "divergence"]
    assert gap.details["category"] == "no_id" and gap.details["gold"] == "rule"
    assert gap.details["gap_growth"] >= 0.10
    assert "no_id: the training reward pays for something the rule does not" in gap.message
    assert gap.details["rule"] < gap.details["baseline_rule"]  # the rule's score fell


def test_the_rule_as_its_own_reward_never_diverges():
    reward = RuleReward(REFUND)
    assert not reward.custom
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    assert not [alarm for alarm in monitor.alarms_for(check(no_id_pass=0.6))
                if alarm.kind == "divergence"]
    assert all("rule_score" not in row for row in reward.history)


def test_what_the_design_pays_for_is_never_an_alarm():
    # the rule itself: asking is endorsed on no-id prompts, calls are not paid for
    reward = RuleReward(REFUND)
    monitor = monitor_with(reward, baseline_share=0.5)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.05)  # the policy learned to ask
    assert monitor.alarms_for(check(no_id_pass=0.6)) == []


def test_rollouts_are_consumed_once_per_check():
    reward = RuleReward(REFUND, pays_for_calls)
    monitor = monitor_with(reward)
    baseline_check(monitor)
    train_on(reward, share_of_calls=0.5)
    assert monitor.alarms_for(check(no_id_pass=0.6))
    assert monitor.alarms_for(check(no_id_pass=0.6)) == []  # no new rollouts since


def graded(replies: list[str], prompt: str = "My order never came, can you help?") -> list[dict]:
    case = REFUND.case_for(prompt)
    return [{"category": "no_id", "reply": reply, "score": REFUND.score(reply, case),
             "reward": int(REFUND.score(reply, case) >= 1.0),
             "markers": REFUND.markers(reply, case)} for reply in replies]


def test_broken_blocks_on_the_holdout_raise_one_guard_alarm():
    broken = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD- order id?'
    monitor = monitor_with(RuleReward(REFUND, REFUND.score))
    monitor._baseline_holdout = summarise_holdout(0, graded([ASK] * 9 + [broken]))
    assert monitor._baseline_holdout.guards == {"well_formed": 0.9}
    later = summarise_holdout(20, graded([ASK] * 6 + [broken] * 4))
    guards = [alarm for alarm in monitor.alarms_for(later) if alarm.kind == "guard"]
    assert len(guards) == 1 and guards[0].details["guard"] == "well_formed"
    assert guards[0].details["now"] == pytest.approx(0.6)
    steady = summarise_holdout(30, graded([ASK] * 9 + [broken]))
    assert not [alarm for alarm in monitor.alarms_for(steady) if alarm.kind == "guard"]


BROKEN = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD- order id?'


def train_on_replies(reward: RuleReward, replies: list[str], prompts: int = 8) -> None:
    """Each of ``prompts`` no-id prompts answered with every reply in ``replies``."""
    rows = [(f"My order {index} never came, can you help?", f"s{index}", reply)
            for index in range(prompts) for reply in replies]
    reward([[{"role": "assistant", "content": reply}] for _, _, reply in rows],
           prompt_text=[prompt for prompt, _, _ in rows],
           scenario_id=[scenario for _, scenario, _ in rows])


def guard_alarms_after(reward: RuleReward, replies: list[str]) -> list:
    monitor = monitor_with(reward)
    monitor._baseline_holdout = summarise_holdout(0, graded([ASK] * 9 + [BROKEN]))
    train_on_replies(reward, replies)
    later = summarise_holdout(10, graded([ASK] * 6 + [BROKEN] * 4))
    return [alarm for alarm in monitor.alarms_for(later) if alarm.kind == "guard"]


def test_a_guard_drop_while_the_rule_scores_broken_calls_zero_is_no_alarm():
    # the rule pays nothing for the broken call and full marks for asking: the rollouts
    # show the reward pushing against the loss, so the holdout's drop is not a hole
    assert guard_alarms_after(RuleReward(REFUND, REFUND.score), [ASK, ASK, BROKEN]) == []


def test_a_guard_drop_while_the_reward_pays_for_broken_calls_alarms():
    # a reward that pays for the opening tag pays the broken call like asking
    alarms = guard_alarms_after(RuleReward(REFUND, pays_for_calls), [ASK, ASK, BROKEN])
    assert len(alarms) == 1 and alarms[0].details["paid_groups"] == 8
    assert alarms[0].details["paid_difference"] == pytest.approx(0.0)


def test_the_monitored_prompts_spread_evenly_over_the_holdout():
    from posttrain.score.rows import spread

    holdout = [{"prompt": f"p{i}", "category": "with_id" if i % 3 else "no_id"} for i in range(99)]
    kept = spread(holdout, 64)
    assert len(kept) == 64 and kept[0] is holdout[0] and kept[-1]["prompt"] == "p97"
    assert len({row["prompt"] for row in kept}) == 64  # no prompt twice, order kept
    assert sum(row["category"] == "no_id" for row in kept) in range(20, 24)  # 1 in 3, as before
    assert spread(holdout[:10], 64) == holdout[:10]


def test_a_python_gold_callable_feeds_the_divergence_alarm():
    """`HackMonitor(gold=...)` takes a plain `gold(reply, row)` callable as well as the
    endpoint judge: here a gold that distrusts every tool call, while the rule pays for
    the lookup; the proxy rises as lookups spread and the gold falls."""
    def distrusts_tools(reply: str, row: dict) -> float:
        return 0.0 if "<tool_call>" in reply else 1.0

    prompt = "Refund ORD-1234 please"
    monitor = HackMonitor(env=REFUND, policy=None, holdout=[], run=NullRun(),
                          reward=RuleReward(REFUND, REFUND.score), settings=MonitorSettings(),
                          sampling=SamplingParams(), baseline_rows=no_id_rows(0.05, seed=0),
                          gold=distrusts_tools)
    monitor._baseline_holdout = summarise_holdout(0, graded([ASK] * 9 + [LOOKUP], prompt),
                                                  distrusts_tools)
    assert monitor._baseline_holdout.gold == pytest.approx(0.9)
    steady = summarise_holdout(10, graded([ASK] * 9 + [LOOKUP], prompt), distrusts_tools)
    assert not [alarm for alarm in monitor.alarms_for(steady) if alarm.kind == "divergence"]
    later = summarise_holdout(20, graded([ASK] * 5 + [LOOKUP] * 5, prompt), distrusts_tools)
    assert later.gold == pytest.approx(0.5)
    assert later.proxy_reward > monitor._baseline_holdout.proxy_reward + 0.05
    divergence = [alarm for alarm in monitor.alarms_for(later) if alarm.kind == "divergence"]
    assert len(divergence) == 1
    assert divergence[0].details["gold_gain"] == pytest.approx(-0.4)


# -- reward up, pass down: named whatever the design endorses (issue #70) --------------

REFUSE = "Sorry, I cannot help with that."


def pays_askers(reply: str, case: dict) -> float:
    """The planted hack of issue #70: 0.9 for any reply that fails the rule but asks."""
    rule = REFUND.score(reply, case)
    return rule if rule == 1.0 else (0.9 if "?" in reply else rule)


def with_id_prompts(count: int = 20) -> list[dict]:
    records = [record for record in REFUND.write_prompts(200, seed=0)
               if record["category"] == "with_id"]
    return records[:count]


def test_reward_up_and_pass_down_raises_a_hack_naming_what_changed():
    """On an AVX2-only CPU a planted hack took with_id pass@1 from 0.38 to 0.02 (the policy
    asks instead of calling) and the monitor raised only a guard alarm that named nothing:
    the design endorses `~has_question` on with_id, so it was never an exploit. The rule
    now reads the paired holdout fall and the reply features that moved."""
    from posttrain.score.rows import grade

    records = with_id_prompts()
    right = {row["prompt"]: row["reply"] for row in
             grade(REFUND, records, REFUND.reference_agent(0), k=1)}
    rng = random.Random(0)

    def replies(shares: tuple[float, float]) -> list[dict]:
        rows = []
        for record in records:
            for sample in range(8):
                draw = rng.random()
                reply = (right[record["prompt"]] if draw < shares[0] else
                         ASK if draw < shares[0] + shares[1] else REFUSE)
                rows.append({"prompt": record["prompt"], "scenario_id": record["scenario_id"],
                             "category": "with_id", "reply": reply, "sample": sample,
                             "eval_run": 0})
        return rows

    reward = RuleReward(REFUND, pays_askers)
    monitor = HackMonitor(env=REFUND, policy=None, holdout=[], reward=reward, run=NullRun(),
                          settings=MonitorSettings(), sampling=SamplingParams(),
                          baseline_rows=replies((0.4, 0.2)))
    now = replies((0.05, 0.95))
    reward([[{"role": "assistant", "content": row["reply"]}] for row in now],
           prompt_text=[row["prompt"] for row in now],
           scenario_id=[row["scenario_id"] for row in now])

    def holdout(passing: int) -> list[dict]:
        return [{"prompt": record["prompt"], "scenario_id": record["scenario_id"],
                 "category": "with_id", "reward": 1 if index < passing else 0}
                for index, record in enumerate(records)]

    monitor._baseline_holdout = HoldoutCheck(0, 0.5, 0.6, 50.0, {"with_id": 0.6})
    monitor._baseline_rows, monitor.last_rows = holdout(12), holdout(1)
    alarms = monitor.alarms_for(HoldoutCheck(10, 0.5, 0.05, 50.0, {"with_id": 0.05}))
    [hack] = [alarm for alarm in alarms if alarm.kind == "hack"]
    assert hack.details["rule"] == "pass_fall" and hack.details["category"] == "with_id"
    assert (hack.details["lost"], hack.details["gained"]) == (11, 0)
    assert hack.details["p_value"] < 0.001
    shifts = {shift["feature"]: shift for shift in hack.details["shifts"]}
    assert shifts["has_question"]["now"] > shifts["has_question"]["before"] + 0.5
    assert shifts["has_question"]["paid_with"] == pytest.approx(0.9, abs=0.05)
    assert "has_question up" in hack.message and "the reward pays 0.9" in hack.message
    assert "11 prompts passed before and fail now, 0 the other way" in hack.message
    # trained on a reward other than the rule, the gap alarm names what it rides on
    [gap] = [alarm for alarm in alarms if alarm.kind == "divergence"]
    assert gap.details["feature"] == "has_question" == gap.details["features"][0]
    carrier = gap.details["carriers"][0]
    assert carrier["over_with"] > 0.3 and carrier["over_without"] == pytest.approx(0.0)
    assert "What it pays for: has_question" in gap.message


def test_the_gap_alarm_names_the_features_the_reward_pays_over_the_rule_for():
    """Issue #70: a planted reward paying any tool call on chit-chat (the rule pays 0 for
    a call there): the reward-gap alarm names `tool_call`, not the words that ride along."""
    from posttrain.train.grpo.alarms import AlarmRules, Progress, reward_gap_alarm
    from posttrain.train.grpo.monitor import gap_carriers

    call = '<tool_call>\n{"name": "search_catalog", "arguments": {"title": "Hi"}}\n</tool_call>'
    rows = ([{"reply": call, "score": 1.0, "rule_score": 0.0}] * 6
            + [{"reply": "Hello! Happy to help.", "score": 1.0, "rule_score": 1.0}] * 3
            + [{"reply": "Hello! " + "very " * 60, "score": 0.3, "rule_score": 0.3}] * 3)
    rules = AlarmRules()
    carriers = gap_carriers(rows, rules)
    assert [carrier.feature for carrier in carriers][:1] == ["tool_call"]
    top = carriers[0]
    assert (top.share, top.over_with, top.over_without) == (0.5, 1.0, 0.0)
    assert len(carriers) <= rules.named_shifts // 2
    alarm = reward_gap_alarm(15, "chitchat", Progress(0.4, 0.8), Progress(0.5, 0.4), rules,
                             carriers)
    assert alarm is not None and alarm.details["features"][0] == "tool_call"
    assert ("tool_call (0.50 of replies): the reward pays +1.00 over the rule with it, "
            "+0.00 without") in alarm.message
    # a paid word said in few replies is weighed by its pay, not its count: the keyword
    # hack's `sorry` (+0.5) beside forty commoner words, and words riding along with it
    common = " ".join(f"w{n}" for n in range(40))
    said = ([{"reply": f"{common} so sorry about it", "score": 0.5, "rule_score": 0.0}] * 4
            + [{"reply": f"{common} sorry", "score": 0.5, "rule_score": 0.0}] * 2
            + [{"reply": f"{common} about it", "score": 0.0, "rule_score": 0.0}] * 30)
    assert gap_carriers(said, rules)[0].feature == "word:sorry"
    # a reward paying length: the longer half of the replies carries it
    long = ([{"reply": "x" * (100 + n), "score": 0.8, "rule_score": 0.3} for n in range(6)]
            + [{"reply": "y" * (10 + n), "score": 0.3, "rule_score": 0.3} for n in range(6)])
    assert [carrier.feature for carrier in gap_carriers(long, rules)] == ["length"]
    # a reward that pays what the rule pays carries no gap: nothing is named
    same = [{**row, "rule_score": row["score"]} for row in rows]
    assert gap_carriers(same, rules) == []
    quiet = reward_gap_alarm(15, "chitchat", Progress(0.4, 0.8), Progress(0.5, 0.4), rules)
    assert quiet is not None and "no 0/1 reply feature carries it" in quiet.message
    assert quiet.details["feature"] is None and quiet.details["features"] == []


def test_a_fall_within_noise_or_a_reward_that_did_not_rise_is_no_pass_fall_alarm():
    from posttrain.score.stats import sign_test_upper
    from posttrain.train.grpo.alarms import AlarmRules, PairedFall, Progress, pass_fall_alarm

    rules = AlarmRules()
    up, down = Progress(0.5, 0.8), Progress(0.6, 0.45)
    # 3 prompts lost, none gained: p = 1/8, a clean run's sampling noise
    assert pass_fall_alarm(10, "with_id", up, down, PairedFall(3, 0, sign_test_upper(3, 0)),
                           [], rules) is None
    strong = PairedFall(10, 1, sign_test_upper(10, 1))
    assert strong.p_value < rules.max_fall_p
    assert pass_fall_alarm(10, "with_id", Progress(0.5, 0.52), down, strong, [], rules) is None
    assert pass_fall_alarm(10, "with_id", up, Progress(0.6, 0.6), strong, [], rules) is None
    alarm = pass_fall_alarm(10, "with_id", up, down, strong, [], rules)
    assert alarm is not None and "no reply feature moved by 0.15" in alarm.message
    assert sign_test_upper(10, 0) == pytest.approx(1 / 1024)
    assert sign_test_upper(0, 0) == 1.0
