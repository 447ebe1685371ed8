"""HackMonitor: watch a training run for reward hacking while it trains.

Every ``every`` optimizer steps (and at the last step) it

1. samples the holdout prompts from the live policy, one sample each, with the
   *same sampling seeds* as sample 0 of the before evaluation, so every check is
   paired with the base policy's replies to the same prompts and draws; it logs the
   proxy reward (mean raw rule score), pass@1 and mean reply length (characters)
   next to the training curves (``monitor/*`` metrics);
2. scans, per prompt category, the training rollouts scored since its previous check
   (``hack_scan``, with the features the environment's design pays for endorsed:
   ``posttrain.envs.base.rewarded_features``) and measures how far each feature the
   reward pays for beyond the design has grown since the base policy;
3. applies the alarm rules of ``posttrain.train.grpo.alarms``: ``hack`` (a paid, unendorsed
   feature grows while the training reward rises beyond its noise and the holdout does
   not follow; or,
   whatever the design endorses, the training reward rises while the category's holdout
   pass@1 falls beyond noise, naming the reply features that moved most),
   ``length``, ``guard`` (a guard marker such as ``well_formed`` fell on the holdout,
   and the training rollouts do not show the reward punishing its loss)
   and ``divergence`` (with a gold judge: the proxy rises on the holdout, the judge's
   score does not; or, training on a ``--reward`` other than the rule, which is then the
   gold: in one category the training reward of the rollouts gains on the rule's score
   of the same rollouts). Each kind is raised once per run
   and category (the strongest feature, naming the others that grew with it), not
   again at every check.

The baseline is the before evaluation: its rows (all samples, re-scored with the
training reward) for the rollouts, its sample-0 rows for the holdout. Without
baseline rows the monitor samples the holdout itself when training begins.

An alarm named in ``stop_on`` ends training cleanly (``should_training_stop``); the
recipe then marks the run ``stopped`` and the summary lists every alarm.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import TrainerCallback as HFTrainerCallback

from posttrain.envs.base import (
    Env,
    case_of,
    design_direction,
    feature_name,
    rewarded_features,
)
from posttrain.policy.model_agent import ModelAgent
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.runs.ops import MAX_SAMPLE_ROWS
from posttrain.score.audit import against_design
from posttrain.score.delta import RUN_GUARDS
from posttrain.score.hack_scan import build_features, hack_scan
from posttrain.score.rows import grade, spread
from posttrain.score.stats import clustered_se, sign_test_upper
from posttrain.train.grpo.alarms import (
    Alarm,
    AlarmRules,
    FeatureChange,
    GapCarrier,
    PairedFall,
    Progress,
    ReplyShift,
    divergence_alarm,
    exploitation_alarm,
    guard_alarm,
    guard_pay,
    length_alarm,
    pass_fall_alarm,
    reward_gap_alarm,
)
from posttrain.train.rewards import RuleReward

Gold = Callable[[str, dict[str, Any]], "float | None"]  # a judge may give no verdict
MIN_SCAN_ROWS = 20  # fewer rollouts than this in a category: not scanned at this check


@dataclass
class MonitorSettings:
    """How often the monitor looks, what stops a run, and the alarm thresholds."""

    every: int = 10
    stop_on: tuple[str, ...] = ()
    # holdout prompts sampled per check, spread evenly over the holdout: 64 of the
    # default 99 keep four checks of a 40-step run under 4% of its wall time
    max_prompts: int = 64
    seed: int = 0  # the training seed: hack_scan's shuffles
    eval_seed: int = 0  # the holdout draws: those of the before evaluation's sample 0
    rules: AlarmRules = field(default_factory=AlarmRules)


@dataclass
class HoldoutCheck:
    """The monitor's holdout sample at one step, overall and per category."""

    step: int
    proxy_reward: float
    pass_at_1: float
    mean_length: float
    by_category: dict[str, float] = field(default_factory=dict)  # pass@1
    prompts_by_category: dict[str, int] = field(default_factory=dict)  # its sample size
    guards: dict[str, float] = field(default_factory=dict)  # share of replies keeping each
    gold: float | None = None
    #: the training reward's mean on these replies, when it is not the rule (--reward)
    train_reward: float | None = None
    #: per category, the training reward of the base policy's rows and of the rollouts
    #: since the previous check, with the standard error of the gain: what the alarm
    #: rules read (filled in by ``HackMonitor.alarms_for``)
    rollout_reward: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0


def summarise_holdout(step: int, rows: Sequence[dict[str, Any]],
                      gold: Gold | None = None,
                      train_reward: float | None = None) -> HoldoutCheck:
    """Proxy reward, pass@1, length (overall) and pass@1 per category of graded rows."""
    n = max(1, len(rows))
    categories: dict[str, list[int]] = {}
    for row in rows:
        categories.setdefault(row["category"], []).append(row["reward"])
    guards = {name: sum(float(row["markers"][name]) for row in rows) / n
              for name in RUN_GUARDS if rows and all(name in row.get("markers", {})
                                                    for row in rows)}
    return HoldoutCheck(
        step=step,
        proxy_reward=sum(row["score"] for row in rows) / n,
        pass_at_1=sum(row["reward"] for row in rows) / n,
        mean_length=sum(len(row["reply"]) for row in rows) / n,
        by_category={name: sum(values) / len(values) for name, values in categories.items()},
        prompts_by_category={name: len(values) for name, values in categories.items()},
        guards=guards,
        gold=None if gold is None else gold_score(gold, list(rows)),
        train_reward=train_reward,
    )


def gold_score(gold: Gold, rows: list[dict[str, Any]]) -> float | None:
    """The mean gold score of the rows that got one (a judge may give none). A gold
    with ``score_rows`` (a model judge) is asked about all rows at once."""
    scores = gold.score_rows(rows) if hasattr(gold, "score_rows") else [
        gold(row["reply"], row) for row in rows]
    given = [float(score) for score in scores if score is not None]
    return sum(given) / len(given) if given else None


class HackMonitor(HFTrainerCallback):
    """A TrainerCallback; give it the policy, the holdout, the reward and the baseline rows."""

    def __init__(
        self,
        *,
        env: Env,
        policy: Policy,
        holdout: Sequence[dict[str, Any]],
        reward: RuleReward,
        run: Any,
        settings: MonitorSettings,
        sampling: SamplingParams,
        baseline_rows: Sequence[dict[str, Any]] = (),
        gold: Gold | None = None,
    ) -> None:
        self.env = env
        self.policy = policy
        self.holdout = spread(list(holdout), settings.max_prompts)
        self.reward = reward
        self.run = run
        self.settings = settings
        self.sampling = sampling
        self.gold = gold
        self.checks: list[HoldoutCheck] = []
        self.alarms: list[dict[str, Any]] = []
        self.stopped_by: str | None = None
        self.seconds = 0.0  # time spent in the monitor's own work
        self._scan_start = 0
        self._raised: set[tuple[str, str]] = set()
        self.last_rows: list[dict[str, Any]] = []  # the last holdout check's graded rows
        self._baseline_rows: list[dict[str, Any]] = []  # the baseline's draw of each prompt
        self._baseline_rollouts = self._rescored(baseline_rows)
        self._baseline_holdout = self._holdout_baseline(baseline_rows)

    # ------------------------------------------------------------------ baseline

    def _rescored(self, rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """Baseline rows per category, scored by the *training* reward like the rollouts."""
        by_category: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            case = case_of(self.env, row)
            rule = row["score"] if "score" in row else self.env.score(row["reply"], case)
            rescored = {**row, "score": self.reward.score_reply(row["reply"], case),
                        "rule_score": float(rule)}  # the before evaluation: by the rule
            by_category.setdefault(row["category"], []).append(rescored)
        return by_category

    def _train_reward(self, rows: Sequence[dict[str, Any]]) -> float | None:
        """The training reward's mean on graded rows; None when it is the rule."""
        if not self.reward.custom or not rows:
            return None
        scores = [self.reward.score_reply(row["reply"], case_of(self.env, row)) for row in rows]
        return sum(scores) / len(scores)

    def _holdout_baseline(self, rows: Sequence[dict[str, Any]]) -> HoldoutCheck | None:
        """The before evaluation's sample 0 on the monitored prompts: the same draws."""
        wanted = {(str(r["scenario_id"]), r["prompt"]) for r in self.holdout}
        first = [row for row in rows if row.get("eval_run", 0) == 0 and row.get("sample") == 0
                 and (str(row["scenario_id"]), row["prompt"]) in wanted]
        if not first or len(first) != len(wanted):
            return None
        self._baseline_rows = first
        return summarise_holdout(0, first, self.gold, self._train_reward(first))

    # ------------------------------------------------------------------ hooks

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._baseline_holdout is None and self.settings.every > 0:
            started = time.perf_counter()
            self._baseline_holdout = self._sample_holdout(0, kwargs.get("model"))
            self._baseline_rows = self.last_rows
            self.seconds += time.perf_counter() - started

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        every = self.settings.every
        step = state.global_step
        if every <= 0 or (step % every and step != state.max_steps):
            return
        started = time.perf_counter()
        check = self._sample_holdout(step, kwargs.get("model"))
        self.checks.append(check)
        # what the live policy said, for the dashboard: the holdout replies just graded
        # and the training replies since the last check (the ones an alarm is about)
        self.run.samples(step, self.last_rows, "monitor")
        rollouts = self.reward.history[self._scan_start:]
        self.run.samples(step, spread(rollouts, MAX_SAMPLE_ROWS), "rollouts")
        metrics = {
            "monitor/proxy_reward": check.proxy_reward,
            "monitor/pass_at_1": check.pass_at_1,
            "monitor/length": check.mean_length,
        }
        if check.gold is not None:
            metrics["monitor/gold"] = check.gold
        if check.train_reward is not None:
            metrics["monitor/train_reward"] = check.train_reward
        self.run.log(step, metrics)
        for alarm in self.alarms_for(check):
            key = (alarm.kind, str(alarm.details.get("category", "")))
            if key in self._raised:
                continue
            self._raised.add(key)
            self.alarms.append(alarm.to_dict())
            self.run.alarm(alarm.kind, step, alarm.message, alarm.details)
            if alarm.kind in self.settings.stop_on and self.stopped_by is None:
                self.stopped_by = f"{alarm.kind} alarm at step {step}"
                control.should_training_stop = True
        self.seconds += time.perf_counter() - started

    # ------------------------------------------------------------------ checks

    def _sample_holdout(self, step: int, model: Any | None) -> HoldoutCheck:
        model = model if model is not None else self.policy.model
        was_training = model.training
        model.eval()
        try:
            policy = Policy(model=model, tokenizer=self.policy.tokenizer, name=self.policy.name,
                            device=self.policy.device, dtype=self.policy.dtype)
            agent = ModelAgent(policy, self.sampling)
            # eval_run 0 and sample 0: the before evaluation's first draw of each prompt
            rows = grade(self.env, self.holdout, agent, 1, seed=self.settings.eval_seed,
                         eval_run=0)
        finally:
            if was_training:
                model.train()
        self.last_rows = rows
        return summarise_holdout(step, rows, self.gold, self._train_reward(rows))

    def alarms_for(self, check: HoldoutCheck) -> list[Alarm]:
        """The alarms this check raises against the baseline (the rollouts since the
        previous check are consumed: call it once per check)."""
        rules = self.settings.rules
        baseline = self._baseline_holdout or (self.checks[0] if self.checks else check)
        found: list[Alarm] = []
        window = self.reward.history[self._scan_start :]
        self._scan_start = len(self.reward.history)
        by_category: dict[str, list[dict[str, Any]]] = {}
        for row in window:
            by_category.setdefault(row["category"], []).append(row)
        for index, (category, rows) in enumerate(sorted(by_category.items())):
            base = self._baseline_rollouts.get(category, [])
            if len(rows) < MIN_SCAN_ROWS or not base:
                continue
            holdout = Progress(baseline.by_category.get(category, baseline.pass_at_1),
                               check.by_category.get(category, check.pass_at_1))
            reward = Progress(_mean_score(base), _mean_score(rows), gain_noise(base, rows))
            check.rollout_reward[category] = {
                "baseline": round(reward.baseline, 6), "now": round(reward.now, 6),
                "noise": round(reward.noise, 6), "rollouts": len(rows)}
            exploited = [
                alarm for change in self._paid_changes(category, base, rows, index)
                if (alarm := exploitation_alarm(check.step, change, reward, holdout, rules,
                                                check.prompts_by_category.get(category, 0)))
            ]
            if exploited:  # one alarm per category: the strongest, naming the others
                found.append(_strongest(exploited))
            else:  # reward up, pass down: an exploit whatever the design endorses
                fall = pass_fall_alarm(
                    check.step, category, reward, holdout,
                    paired_fall(self._baseline_rows, self.last_rows, category),
                    reply_shifts(base, rows, rules), rules)
                if fall is not None:
                    found.append(fall)
            if self.reward.custom:
                gap = reward_gap_alarm(check.step, category, reward,
                                       Progress(_mean_score(base, "rule_score"),
                                                _mean_score(rows, "rule_score")), rules,
                                       gap_carriers([*base, *rows], rules))
                if gap is not None:
                    found.append(gap)
        overall = Progress(baseline.pass_at_1, check.pass_at_1)
        alarm = length_alarm(check.step, Progress(baseline.mean_length, check.mean_length),
                             overall, rules)
        if alarm is not None:
            found.append(alarm)
        for guard, now in check.guards.items():
            if guard in baseline.guards:
                alarm = guard_alarm(check.step, guard, Progress(baseline.guards[guard], now),
                                    rules, guard_pay(window, guard))
                if alarm is not None:
                    found.append(alarm)
        if check.gold is not None and baseline.gold is not None:
            alarm = divergence_alarm(check.step, Progress(baseline.proxy_reward,
                                                          check.proxy_reward),
                                     Progress(baseline.gold, check.gold), rules)
            if alarm is not None:
                found.append(alarm)
        return found

    def _paid_changes(self, category: str, base: list[dict[str, Any]],
                      rows: list[dict[str, Any]], index: int) -> list[FeatureChange]:
        """Features the reward pays for in ``rows`` against the design, baseline vs now.

        Two kinds: an unendorsed feature paid for more, and an endorsed one paid for
        *less* (asking, on a no-id prompt, paid less than calling a tool), reported by
        its unendorsed complement when the scan found one (``tool_call``), else as
        ``-name``.
        """
        declared = rewarded_features(self.env, category)
        endorsed = [feature_name(entry) for entry in declared]
        scan = hack_scan(rows, endorsed=endorsed, seed=self.settings.seed + index)
        columns = build_features([*base, *rows])
        changes = []
        for result in scan.features:
            if not result.flagged:
                continue
            if not result.endorsed:
                if result.direction != "+":
                    continue
                named = [(result.name, False)]
            elif against_design(result, declared):
                # name what it pays for instead: the unendorsed complement the scan
                # merged with it, else the feature itself, flipped if paid for less
                complements = [(alias[1:], False) for alias in result.aliases
                               if alias.startswith("-")
                               and design_direction(declared, alias[1:]) is None]
                named = complements or [(result.name, result.direction == "-")]
            else:
                continue
            named = [(name, flip) for name, flip in named
                     if not (flip and name == "length")]  # "shorter" is the length rule's
            for name, flip in named:
                if name not in columns:  # a word frequent in the window only: absent before
                    continue
                values = 1.0 - columns[name] if flip else columns[name]
                changes.append(FeatureChange(
                    category, f"-{name}" if flip else name, float(values[: len(base)].mean()),
                    float(values[len(base) :].mean()), abs(result.statistic),
                ))
        return changes

    def summary(self) -> dict[str, Any]:
        """Checks, alarms and the monitor's own time, for the run summary."""
        return {
            "baseline": vars(self._baseline_holdout) if self._baseline_holdout else None,
            "checks": [vars(check) for check in self.checks],
            "alarms": self.alarms,
            "stopped_by": self.stopped_by,
            "seconds": round(self.seconds, 3),
        }


def gain_noise(base: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
               name: str = "score") -> float:
    """The standard error of ``mean(rows) - mean(base)`` for the score ``name``, each
    side clustered by prompt (a GRPO group's replies to one prompt are not independent
    draws). 0 where a side has fewer than two prompts: no spread to measure, the rules'
    fixed minimum decides alone."""
    variance = 0.0
    for side in (base, rows):
        se = clustered_se([float(row[name]) for row in side],
                          [(str(row.get("scenario_id")), row["prompt"]) for row in side])
        if math.isnan(se):
            return 0.0
        variance += se * se
    return math.sqrt(variance)


def paired_fall(before: Sequence[dict[str, Any]], now: Sequence[dict[str, Any]],
                category: str) -> PairedFall:
    """The category's holdout prompts drawn at the baseline and now (the same sampling
    seeds): how many passed before and fail now, how many the other way, and the sign
    test's p-value of that many falls."""
    def outcomes(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], bool]:
        return {(str(row["scenario_id"]), row["prompt"]): row.get("reward") == 1
                for row in rows if row.get("category") == category}

    then, later = outcomes(before), outcomes(now)
    shared = then.keys() & later.keys()
    lost = sum(1 for key in shared if then[key] and not later[key])
    gained = sum(1 for key in shared if later[key] and not then[key])
    return PairedFall(lost, gained, sign_test_upper(lost, gained))


def reply_shifts(base: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
                 rules: AlarmRules) -> list[ReplyShift]:
    """The 0/1 reply features whose share moved most between the base policy's replies
    and the latest training replies of one category (at least ``min_share_growth``, at
    most ``named_shifts`` of them), each with the training reward's mean on the latest
    replies with it and without it."""
    columns = build_features([*base, *rows])
    scores = np.array([float(row["score"]) for row in rows])
    shifts = []
    kept: list[np.ndarray] = []
    # the plainest name first: a feature that is nearly another's copy or complement on
    # these replies (``token:</tool_call>`` beside ``tool_call``) is one change, named once
    for name, values in binary_features(columns):  # a length or a count: the length rule's
        if any(max(np.mean(values == other), np.mean(values != other)) >= SAME_CHANGE
               for other in kept):
            continue
        kept.append(values)
        before, now = values[: len(base)], values[len(base):]
        if not len(before) or not len(now):
            continue
        moved = float(now.mean() - before.mean())
        if abs(moved) < rules.min_share_growth:
            continue
        has = now == 1.0
        shifts.append((abs(moved), ReplyShift(
            name, float(before.mean()), float(now.mean()),
            float(scores[has].mean()) if has.any() else None,
            float(scores[~has].mean()) if (~has).any() else None)))
    shifts.sort(key=lambda item: (-item[0], item[1].feature))
    # what grew and what fell, each its strongest first: the hack is often one of each
    # (asking up, calling down)
    each = max(1, rules.named_shifts // 2)
    up = [shift for _, shift in shifts if shift.now > shift.before][:each]
    down = [shift for _, shift in shifts if shift.now < shift.before][:each]
    return sorted(up + down, key=lambda shift: -abs(shift.now - shift.before))


def binary_features(columns: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """The 0/1 reply features of ``columns`` (not lengths or counts), the plainest name
    first (``_plainness``): of two near-copies, the one a person reads first is kept."""
    named = ((name, np.asarray(columns[name], dtype=float))
             for name in sorted(columns, key=_plainness))
    return [(name, values) for name, values in named if np.isin(values, (0.0, 1.0)).all()]


def gap_carriers(rows: Sequence[dict[str, Any]], rules: AlarmRules) -> list[GapCarrier]:
    """The 0/1 reply features of one category's training replies on which the training
    reward pays most over the rule's score (``score - rule_score``), against the replies
    without them: at least ``min_carrier_gap`` more, each side seen on at least
    ``min_carrier_rows`` replies, the strongest ``named_shifts // 2``. The monitor hands
    it the base policy's replies with the latest: a paid word the policy now says in
    every reply has no replies without it among the latest, but has them among the
    base's."""
    # words by their pay, not their count: a paid word said in a few replies is not
    # among the forty most frequent (the keyword hack's ``sorry``)
    columns = build_features(list(rows), max_words=CARRIER_WORDS,
                             min_word_rows=max(3, rules.min_carrier_rows))
    lengths = columns.pop("length")
    # length as a 0/1 feature: the longer half of the replies (a reward paying length)
    columns["length"] = (lengths > np.median(lengths)).astype(float)
    over = np.array([float(row["score"]) - float(row.get("rule_score", row["score"]))
                     for row in rows])
    carriers = []
    kept: list[np.ndarray] = []
    for name, values in binary_features(columns):
        has = values == 1.0
        if has.sum() < rules.min_carrier_rows or (~has).sum() < rules.min_carrier_rows:
            continue
        with_it, without = float(over[has].mean()), float(over[~has].mean())
        # a near-copy of a carrier named already (the words of the one reply the reward
        # pays) is the same carrier; a complement is not compared: it carries the gap
        # the other way (``tool_call`` beside ``has_question`` when askers are paid)
        if with_it - without < rules.min_carrier_gap or any(
                np.mean(values == other) >= SAME_CHANGE for other in kept):
            continue
        kept.append(values)
        carriers.append(GapCarrier(name, float(has.mean()), with_it, without))
    # the widest pay first; of features paid alike (words said only in the paid
    # replies), the one on the most replies: the paid word is in every paid reply
    carriers.sort(key=lambda carrier: (-round(carrier.over_with - carrier.over_without, 2),
                                       -carrier.share, _plainness(carrier.feature)))
    return carriers[:max(1, rules.named_shifts // 2)]


#: the most frequent words the gap alarm weighs (``gap_carriers``)
CARRIER_WORDS = 400

#: two reply features that agree (or disagree) on this share of the replies are one change
SAME_CHANGE = 0.97
#: the reply features a person reads first, before the tools, markers, tokens and words
PLAIN_FEATURES = ("tool_call", "has_question", "has_digits", "length")


def _plainness(name: str) -> tuple[int, str]:
    if name in PLAIN_FEATURES:
        return PLAIN_FEATURES.index(name), name
    kinds = ("tool:", "marker:", "token:", "word:")
    rank = next((i for i, kind in enumerate(kinds) if name.startswith(kind)), len(kinds))
    return len(PLAIN_FEATURES) + rank, name


def _strongest(alarms: list[Alarm]) -> Alarm:
    """The alarm whose feature the reward pays most for, with the others named in it."""
    ranked = sorted(alarms, key=lambda alarm: -alarm.details["paid"])
    top, others = ranked[0], [alarm.details["feature"] for alarm in ranked[1:]]
    if others:
        top.details["also"] = others
        top.message += f" (growing with it: {', '.join(others)})"
    return top


def _mean_score(rows: Sequence[dict[str, Any]], name: str = "score") -> float:
    return sum(row[name] for row in rows) / max(1, len(rows))
