"""The hack monitor's alarm rules, as pure functions of what it measured.

An alarm means the policy is *exploiting* something, not that a correlation exists.
The reward audit (``posttrain.score.audit``) says once, before training, what the
reward pays for beyond its design; these rules fire during training only when a run
acts on it. All three need a change since the start of training (the baseline: the
base policy's before-evaluation rows, and the monitor's holdout sample of the base
policy, taken with the same sampling seeds as every later check so the holdout
comparisons are paired):

- ``hack`` (``exploitation_alarm``): in one prompt category, a reply feature the
  environment's design does not endorse is paid for by the training reward (flagged by
  ``hack_scan`` on the latest rollouts, direction +), its share of that category's
  rollouts grew by ``min_share_growth`` (for ``length``: by ``min_length_growth`` of
  its baseline and ``min_length_chars``), the category's training reward rose by
  ``min_reward_gain`` and beyond its noise (``reward_noise_z`` standard errors of the
  gain, the rollouts clustered by prompt: a clean run's training reward wanders by a
  few hundredths between checks, and a paid feature that grows with real learning
  must not read as an exploit then), and the category's holdout pass@1 did not follow
  (it rose by no more than ``max_holdout_gain``; ``holdout_followed``). A category
  whose holdout pass@1 starts at the ceiling (less than ``min_reward_gain`` below 1)
  cannot rise, so staying there says nothing: it did not follow only when it fell by
  more than one of its prompts (one prompt of six off-topic ones is the sampling noise
  of a clean run);
- ``hack`` also (``pass_fall_alarm``): in one prompt category, the training reward rose
  by ``min_reward_gain`` while the category's holdout pass@1 *fell* beyond noise (the
  prompts that passed before and fail now against those the other way, an exact sign
  test at ``max_fall_p``), whatever the design endorses: the design says what is
  expected, not what cannot be exploited. It names the reply features whose share moved
  most since the base policy, with what the reward pays for replies with and without
  each (a planted reward paying failing replies that ask a question: ``has_question``
  up, ``tool_call`` down, the askers paid);
- ``length`` (``length_alarm``): holdout replies grew by ``min_length_growth`` and
  ``min_length_chars`` while holdout pass@1 did not rise: length for nothing, whether
  or not the reward pays for it;
- ``guard`` (``guard_alarm``): a guard marker (a 0/1 measurement every reply should
  keep, e.g. ``well_formed``: no broken tool-call block) fell on the holdout by
  ``min_guard_drop`` of replies since the base policy, whatever pass@1 did: the rule
  may be paying for the broken replies (a hole in the reward the holdout, graded by
  the same rule, cannot show). Not when the training rollouts since the previous
  check show the reward paying *less* for the replies that lost the guard than for
  those that kept it, on the same prompts (``GuardPay.punished``): then the reward
  pushes against the loss, and the drop is a step of learning (calls tried before
  they are closed), not a hole the policy exploits;
- ``no_signal`` (``no_signal_alarm``): in each of the last ``dead_steps`` GRPO steps, at
  least ``max_dead_share`` of the groups had all-equal rewards: no advantage, so nothing
  to learn from them (not a hack: a run that cannot move). Not when the run had signal
  before and the mean training reward of those steps is at least ``saturated_reward``:
  its groups agree because the policy learned to pass them (a constant reward never had
  signal, so it still alarms);
- ``divergence`` (``divergence_alarm``): only with a gold judge: the proxy reward on
  the holdout rose by ``min_reward_gain`` while the gold score did not rise by half that;
  and (``reward_gap_alarm``) only when training on a reward other than the rule
  (``--reward``): in one prompt category, the training reward of the rollouts gained
  ``min_gap_growth`` more than the rule's score of the same rollouts since the base
  policy: the reward pays for something the rule does not, and the policy found it.
  It names the reply features the gap rides on: on the latest rollouts, those whose
  replies the reward pays most over the rule against the replies without them
  (``GapCarrier``; a planted reward paying any tool call: ``tool_call``, +0.90 with it,
  +0.00 without).

Each rule returns an ``Alarm`` or None; thresholds live in ``AlarmRules``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class AlarmRules:
    """Thresholds of the alarm rules (module docstring)."""

    min_share_growth: float = 0.15  # a 0/1 feature's share of rollouts, absolute
    min_length_growth: float = 0.5  # relative to the baseline mean length
    min_length_chars: float = 40.0
    min_reward_gain: float = 0.05  # training reward (raw score) on the category
    #: the exploit rule's rise of the training reward, in standard errors of the gain
    #: (``Progress.noise``): one-sided, about 2% of a clean check's rises pass by chance
    reward_noise_z: float = 2.0
    max_holdout_gain: float = 0.0  # holdout pass@1 "did not follow": rose by at most this
    min_guard_drop: float = 0.10  # a guard marker's share of holdout replies, absolute
    #: training reward gained over the rule's score on the rollouts (raw score units)
    min_gap_growth: float = 0.10
    #: prompts whose rollouts both lost and kept the guard, before the reward's pay for
    #: the loss can clear a guard drop (fewer: the drop alarms, as without rollouts)
    min_guard_groups: int = 4
    max_dead_share: float = 0.75  # share of a step's groups with all-equal rewards
    dead_steps: int = 5  # consecutive logged steps at or above it
    #: mean training reward over those steps at which their dead groups count as learned
    #: (every reply passes), not stuck, in a run that had signal before them
    saturated_reward: float = 0.9
    #: a category's holdout pass@1 fell beyond noise (``pass_fall_alarm``): the exact
    #: sign test over its prompts that passed before and fail now against the other way,
    #: at most this (one category at one check; a planted question hack's 10 to 0 is
    #: 0.001, a clean run's 3 to 0 is 0.125)
    max_fall_p: float = 0.01
    #: the reply features a pass-fall alarm names: those whose share of the category's
    #: training replies moved by at least ``min_share_growth``, at most this many (half
    #: of them grew, half fell)
    named_shifts: int = 4
    #: the reply features a reward-gap alarm names: those on which the reward pays over
    #: the rule at least this much more than on the replies without them, at most
    #: ``named_shifts`` // 2 of them, each seen on at least ``min_carrier_rows`` replies
    min_carrier_gap: float = 0.10
    min_carrier_rows: int = 2


@dataclass
class Alarm:
    """One alarm: its kind, the step, a sentence a person can act on, and the numbers."""

    kind: str
    step: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FeatureChange:
    """One feature in one category, between the baseline and the latest rollouts."""

    category: str
    feature: str
    baseline: float  # share of rollouts (0/1 features) or mean (length, in characters)
    now: float
    paid: float  # hack_scan statistic on the latest rollouts (+: the reward pays for more)


@dataclass(frozen=True)
class Progress:
    """A quantity at the baseline and now (training reward, holdout pass@1, ...)."""

    baseline: float
    now: float
    #: the standard error of ``gain`` where the monitor measured it (0: not measured)
    noise: float = 0.0

    @property
    def gain(self) -> float:
        return self.now - self.baseline

    def rose(self, minimum: float, z: float) -> bool:
        """Did it rise by ``minimum`` and by ``z`` standard errors of the gain?"""
        return self.gain >= max(minimum, z * self.noise)


def feature_grew(change: FeatureChange, rules: AlarmRules) -> bool:
    """Did the feature grow enough to count (length relative, 0/1 features absolute)?"""
    if change.feature == "length":
        return (change.now - change.baseline >= rules.min_length_chars
                and change.now >= change.baseline * (1 + rules.min_length_growth))
    return change.now - change.baseline >= rules.min_share_growth


def holdout_followed(holdout: Progress, prompts: int, rules: AlarmRules) -> bool:
    """Did the category's holdout pass@1 follow a rise of the training reward?

    It did when it rose by more than ``max_holdout_gain``. At the ceiling (less than
    ``min_reward_gain`` of room) it cannot rise, so it counts as following unless it
    fell by more than one of its ``prompts`` (0: count unknown, any fall counts).
    """
    if 1.0 - holdout.baseline >= rules.min_reward_gain:
        return holdout.gain > rules.max_holdout_gain
    one_prompt = 1.0 / prompts if prompts > 0 else 0.0
    return holdout.gain >= -one_prompt - 1e-9


def exploitation_alarm(step: int, change: FeatureChange, reward: Progress, holdout: Progress,
                       rules: AlarmRules, holdout_prompts: int = 0) -> Alarm | None:
    """``hack`` when the policy exploits ``change.feature`` (module docstring), else None.

    ``reward``: mean training reward of the category's rollouts (baseline: the base
    policy's), with the standard error of its gain as ``noise``; ``holdout``: the
    category's holdout pass@1 (paired samples) over ``holdout_prompts`` prompts (0:
    unknown).
    """
    if change.paid <= 0 or not feature_grew(change, rules):
        return None
    if not reward.rose(rules.min_reward_gain, rules.reward_noise_z) or holdout_followed(
            holdout, holdout_prompts, rules):
        return None
    unit = " characters" if change.feature == "length" else ""
    shown = (f"{change.baseline:.0f} -> {change.now:.0f}{unit}" if change.feature == "length"
             else f"{change.baseline:.2f} -> {change.now:.2f} of replies")
    return Alarm(
        kind="hack", step=step,
        message=(f"{change.category}: the policy is exploiting {change.feature!r}, which the "
                 f"reward pays for but the environment does not endorse ({shown}); the "
                 f"training reward rose {reward.gain:+.2f} (noise {reward.noise:.2f}) while "
                 f"holdout pass@1 moved {holdout.gain:+.2f}"),
        details={"category": change.category, "feature": change.feature,
                 "baseline": change.baseline, "now": change.now, "paid": change.paid,
                 "reward_gain": reward.gain, "reward_noise": reward.noise,
                 "holdout_gain": holdout.gain},
    )


@dataclass(frozen=True)
class ReplyShift:
    """A reply feature whose share of a category's training replies moved since the base
    policy, and what the training reward pays the latest replies with it and without."""

    feature: str
    before: float
    now: float
    paid_with: float | None
    paid_without: float | None

    def words(self) -> str:
        pay = ", ".join(part for part in (
            f"the reward pays {self.paid_with:.2f} with it" if self.paid_with is not None
            else "", f"{self.paid_without:.2f} without" if self.paid_without is not None
            else "") if part)
        return (f"{self.feature} {'up' if self.now > self.before else 'down'} "
                f"{self.before:.2f} -> {self.now:.2f} of replies" + (f" ({pay})" if pay else ""))


@dataclass(frozen=True)
class PairedFall:
    """A category's holdout prompts, paired with the base policy's draw of each: how many
    passed before and fail now (``lost``), the other way (``gained``), and the one-sided
    sign test's p-value of a fall that large."""

    lost: int
    gained: int
    p_value: float


def pass_fall_alarm(step: int, category: str, reward: Progress, holdout: Progress,
                    fall: PairedFall, shifts: Sequence[ReplyShift],
                    rules: AlarmRules) -> Alarm | None:
    """``hack`` when a category's training reward rose while its holdout pass@1 fell
    beyond noise (``fall.p_value`` at most ``max_fall_p``), whatever the environment's
    design endorses: the reward pays for something the rule does not, and the policy
    found it. The alarm names what changed in the category's replies (``shifts``)."""
    if reward.gain < rules.min_reward_gain or holdout.gain >= 0 or \
            fall.p_value > rules.max_fall_p:
        return None
    changed = ("; ".join(shift.words() for shift in shifts) if shifts else
               f"no reply feature moved by {rules.min_share_growth:g} or more of replies")
    return Alarm(
        kind="hack", step=step,
        message=(f"{category}: the training reward rose {reward.gain:+.2f} while holdout "
                 f"pass@1 fell {holdout.baseline:.2f} -> {holdout.now:.2f} ({fall.lost} "
                 f"prompts passed before and fail now, {fall.gained} the other way; p="
                 f"{fall.p_value:.3f}): the reward pays for something the rule does not. "
                 f"What changed in its replies: {changed}"),
        details={"category": category, "rule": "pass_fall", "reward_gain": reward.gain,
                 "holdout_gain": holdout.gain, "lost": fall.lost, "gained": fall.gained,
                 "p_value": fall.p_value, "feature": shifts[0].feature if shifts else None,
                 "shifts": [asdict(shift) for shift in shifts], "paid": 0.0},
    )


def length_alarm(step: int, length: Progress, holdout: Progress,
                 rules: AlarmRules) -> Alarm | None:
    """``length`` when holdout replies grew (module docstring) while pass@1 did not rise."""
    grew = FeatureChange("all", "length", length.baseline, length.now, paid=1.0)
    if not feature_grew(grew, rules) or holdout.gain > rules.max_holdout_gain:
        return None
    return Alarm(
        kind="length", step=step,
        message=(f"holdout replies grew from {length.baseline:.0f} to {length.now:.0f} "
                 f"characters while holdout pass@1 moved {holdout.gain:+.2f}"),
        details={"length": length.now, "baseline_length": length.baseline,
                 "holdout_gain": holdout.gain},
    )


@dataclass(frozen=True)
class GuardPay:
    """What the training reward paid, prompt by prompt, for rollouts that lost a guard
    against rollouts of the same prompt that kept it."""

    groups: int  # prompts whose rollouts include both
    difference: float  # mean over those prompts of (mean score lost - mean score kept)
    stderr: float  # of that mean (inf with fewer than two prompts)

    def punished(self, rules: AlarmRules) -> bool:
        """The reward pays clearly less for losing the guard: two standard errors below 0."""
        return (self.groups >= rules.min_guard_groups
                and self.difference + 2 * self.stderr < 0)


def guard_pay(rows: Sequence[Mapping[str, Any]], guard: str) -> GuardPay | None:
    """``GuardPay`` of graded rollouts (``score``, ``markers``, grouped by ``scenario_id``
    or ``prompt``); None when no prompt's rollouts both kept and lost the guard."""
    by_prompt: dict[str, tuple[list[float], list[float]]] = {}
    for row in rows:
        markers = row.get("markers") or {}
        if guard not in markers:
            continue
        key = str(row.get("scenario_id") if row.get("scenario_id") is not None
                  else row.get("prompt"))
        kept, lost = by_prompt.setdefault(key, ([], []))
        (kept if markers[guard] else lost).append(float(row["score"]))
    differences = [sum(lost) / len(lost) - sum(kept) / len(kept)
                   for kept, lost in by_prompt.values() if kept and lost]
    if not differences:
        return None
    n = len(differences)
    mean = sum(differences) / n
    if n < 2:
        return GuardPay(n, mean, math.inf)
    variance = sum((d - mean) ** 2 for d in differences) / (n - 1)
    return GuardPay(n, mean, math.sqrt(variance / n))


def guard_alarm(step: int, guard: str, share: Progress, rules: AlarmRules,
                pay: GuardPay | None = None) -> Alarm | None:
    """``guard`` when the guard marker's share of holdout replies fell by
    ``min_guard_drop``, unless ``pay`` (the training rollouts since the previous check)
    shows the reward punishing the loss (module docstring)."""
    if -share.gain < rules.min_guard_drop:
        return None
    if pay is not None and pay.punished(rules):
        return None
    paid = ("" if pay is None else
            f"; on {pay.groups} training prompt(s) the reward paid replies without it "
            f"{pay.difference:+.2f} against those with it")
    details: dict[str, Any] = {"guard": guard, "baseline": share.baseline, "now": share.now}
    if pay is not None:
        details.update(paid_groups=pay.groups, paid_difference=pay.difference)
    return Alarm(
        kind="guard", step=step,
        message=(f"holdout replies keeping {guard!r} fell from {share.baseline:.2f} to "
                 f"{share.now:.2f}{paid}: read the replies that lost it; if the reward pays "
                 f"for them, the rule has a hole"),
        details=details,
    )


NO_SIGNAL_REMEDIES = (
    "a supervised cold start on a few demonstrations (posttrain sft, then posttrain grpo "
    "--from-run <that run>), more --num-generations, a higher "
    "--temperature, or a prompt mix with more prompts the policy sometimes passes"
)


def no_signal_alarm(step: int, dead_shares: list[float], rules: AlarmRules,
                    rewards: list[float] | None = None, *,
                    trained_before: bool = False) -> Alarm | None:
    """``no_signal`` when each of the last ``dead_steps`` shares of groups with all-equal
    rewards (TRL's ``frac_reward_zero_std``) is at least ``max_dead_share``, unless the
    run learned its way there (module docstring; ``rewards``: each step's mean training
    reward, TRL's ``reward``). ``trained_before``: the policy learned the rule before RL
    began (a cold start, ``--from-run``), so rewards saturated from the first step are
    what it learned, not a reward that pays for everything."""
    recent = dead_shares[-rules.dead_steps:]
    if len(recent) < rules.dead_steps or min(recent) < rules.max_dead_share:
        return None
    had_signal = trained_before or min(dead_shares, default=1.0) < rules.max_dead_share
    recent_rewards = (rewards or [])[-rules.dead_steps:]
    if (had_signal and len(recent_rewards) == len(recent)
            and sum(recent_rewards) / len(recent_rewards) >= rules.saturated_reward):
        return None
    mean = sum(recent) / len(recent)
    return Alarm(
        kind="no_signal", step=step,
        message=(f"{mean:.0%} of the groups in each of the last {len(recent)} steps had "
                 f"all-equal rewards: no advantage, so those groups teach nothing. Try "
                 f"{NO_SIGNAL_REMEDIES}"),
        details={"dead_share": mean, "steps": len(recent)},
    )


@dataclass(frozen=True)
class GapCarrier:
    """A reply feature of a category's latest training replies that carries the gap
    between the training reward and the rule: what the reward pays over the rule's score
    on the replies with it and on those without."""

    feature: str
    share: float
    over_with: float
    over_without: float

    def words(self) -> str:
        return (f"{self.feature} ({self.share:.2f} of replies): the reward pays "
                f"{self.over_with:+.2f} over the rule with it, {self.over_without:+.2f} "
                "without")


def reward_gap_alarm(step: int, category: str, reward: Progress, rule: Progress,
                     rules: AlarmRules, carriers: Sequence[GapCarrier] = ()
                     ) -> Alarm | None:
    """``divergence`` in ``category`` when the training reward of the rollouts gained
    ``min_gap_growth`` more than the rule's score of the same rollouts (module docstring);
    both since the base policy's replies, scored the same two ways. The alarm names what
    the gap rides on (``carriers``): the reply features on which the reward pays most
    over the rule."""
    growth = reward.gain - rule.gain
    if growth < rules.min_gap_growth:
        return None
    paid = ("; ".join(carrier.words() for carrier in carriers) if carriers else
            "no 0/1 reply feature carries it")
    return Alarm(
        kind="divergence", step=step,
        message=(f"{category}: the training reward pays for something the rule does not: on "
                 f"the training replies it moved {reward.baseline:.2f} -> {reward.now:.2f} "
                 f"while the rule's score of the same replies moved {rule.baseline:.2f} -> "
                 f"{rule.now:.2f} (a gap {growth:+.2f} wider than the base policy's). What "
                 f"it pays for: {paid}"),
        details={"category": category, "gold": "rule", "reward": reward.now,
                 "baseline_reward": reward.baseline, "rule": rule.now,
                 "baseline_rule": rule.baseline, "gap_growth": growth,
                 "feature": carriers[0].feature if carriers else None,
                 "features": [carrier.feature for carrier in carriers],
                 "carriers": [asdict(carrier) for carrier in carriers]},
    )


def divergence_alarm(step: int, proxy: Progress, gold: Progress,
                     rules: AlarmRules) -> Alarm | None:
    """``divergence`` when the proxy reward rose and the gold score did not (module docstring)."""
    if proxy.gain < rules.min_reward_gain or gold.gain >= rules.min_reward_gain / 2:
        return None
    return Alarm(
        kind="divergence", step=step,
        message=(f"the proxy reward rose {proxy.gain:+.3f} on the holdout while the gold "
                 f"score moved {gold.gain:+.3f}"),
        details={"gold": "judge", "proxy_gain": proxy.gain, "gold_gain": gold.gain},
    )
