"""Whether a GRPO run begins with a supervised cold start (``--cold-start
none|auto|sft|self``),
read from the base policy's holdout rows; the cold start itself is ``cold_start.py``.

GRPO learns only from groups whose replies score differently. A real model that never
does what the rule pays for on some kind of prompt (SmolLM2-135M never calls the refund
tool: none of its with-id replies pass, every group scores alike) gives RL nothing to
reinforce there. ``read_signal`` reads the baseline phase's rows: per category, how many
replies passed and how many groups (one prompt's samples in one evaluation) scored all
alike. ``choose_cold_start``: ``sft`` always, ``none`` never, ``auto`` when some category's
pass rate is *shown* low and the run does not start from ``--from-run``: from the
environment's reference agent when it has one, else from the policy's own passing replies
(``self``, ``cold_start_self``); an environment that plays episodes gets none, said.

Shown low, not seen low: a category passing 0 of 3 holdout replies says little (another
CPU's rounding passes 1 of 3, and the run would be another run). A category is shown low
when the upper end of its exact one-sided 95% interval (Clopper-Pearson, the replies taken
as independent draws) is under ``LOW_PASS_MARK``: 0 passed needs 59 replies. With fewer
replies than that, ``auto`` keeps its default (no cold start) and says which counts were
too few and how many it needs ("too few replies to decide: no_id 0 of 3, 59 needed").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, ReferenceAgentSource, has_hook, is_multi_turn, require_hook
from posttrain.errors import PosttrainError
from posttrain.score.stats import clopper_pearson_upper

COLD_STARTS = ("none", "auto", "sft", "self")

#: a category's pass rate is shown low when its one-sided interval's upper end is under
#: this (at ``LOW_PASS_CONFIDENCE``): RL then draws a passing reply in fewer than one
#: group of 8 in 2.5 (1 - 0.95**8 = 0.34 of groups at most have any signal)
LOW_PASS_MARK = 0.05
LOW_PASS_CONFIDENCE = 0.95
#: where ``replies_needed`` stops counting (a rate just under the mark needs millions)
MOST_REPLIES_NEEDED = 1_000_000


@dataclass
class CategorySignal:
    """What the base policy's holdout rows of one category give RL to learn from."""

    name: str
    replies: int = 0
    passed: int = 0
    groups: int = 0  # one prompt's samples in one evaluation
    all_equal: int = 0  # of those, groups whose replies all scored the same

    def words(self) -> str:
        alike = f", {self.all_equal} of {self.groups} groups all alike" if self.groups else ""
        return f"{self.name} {self.passed}/{self.replies} passed{alike}"

    def pass_upper_bound(self) -> float:
        """The upper end of the pass rate's one-sided interval (1.0 with no replies)."""
        if not self.replies:
            return 1.0
        return clopper_pearson_upper(self.passed, self.replies, LOW_PASS_CONFIDENCE)

    def shown_low(self) -> bool:
        """Whether the replies show the pass rate under ``LOW_PASS_MARK``."""
        return self.pass_upper_bound() < LOW_PASS_MARK

    def seen_low(self) -> bool:
        """Whether the rate seen is under the mark, shown or not (the replies might show it
        with more of them)."""
        return bool(self.replies) and self.passed / self.replies < LOW_PASS_MARK

    def replies_needed(self) -> int:
        """The fewest replies that would show this category low at its pass rate so far
        (0 passed: 59)."""
        rate = self.passed / self.replies if self.replies else 0.0

        def shows(count: int) -> bool:
            return clopper_pearson_upper(round(rate * count), count,
                                         LOW_PASS_CONFIDENCE) < LOW_PASS_MARK

        # doubling, then halving the gap: a rate near the mark needs very many replies
        low, high = max(self.replies, 1) - 1, max(self.replies, 1)
        while not shows(high):
            if high >= MOST_REPLIES_NEEDED:
                return MOST_REPLIES_NEEDED
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if shows(middle) else (middle, high)
        return high


def read_signal(rows: list[dict[str, Any]]) -> list[CategorySignal]:
    """Per category (in the rows' order), replies passed and groups scored all alike."""
    by_category: dict[str, CategorySignal] = {}
    scores: dict[tuple[str, Any, str], list[float]] = {}
    for row in rows:
        name = str(row.get("category"))
        signal = by_category.setdefault(name, CategorySignal(name))
        signal.replies += 1
        signal.passed += 1 if row.get("reward") == 1 else 0
        scores.setdefault((name, row.get("eval_run"), str(row.get("prompt"))), []).append(
            float(row.get("score", row.get("reward", 0.0))))
    for (name, _run, _prompt), group in scores.items():
        if len(group) > 1:
            by_category[name].groups += 1
            by_category[name].all_equal += 1 if len(set(group)) == 1 else 0
    return list(by_category.values())


@dataclass
class ColdStartChoice:
    """Whether this run starts with a supervised cold start, and why (said and recorded)."""

    run: bool
    reason: str
    signal: list[CategorySignal] = field(default_factory=list)
    #: what it learns from: the environment's reference agent, or the policy's own
    #: passing replies (``cold_start_self``)
    source: str = "reference"

    @property
    def name(self) -> str:
        """The plan's word for it: none, sft (from the reference agent) or self."""
        return ("self" if self.source == "self" else "sft") if self.run else "none"

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "reason": self.reason,
                **({"source": self.source} if self.run else {}),
                "signal": [vars(category) for category in self.signal]}


def has_reference_agent(env: Env) -> bool:
    return has_hook(env, ReferenceAgentSource) and not is_multi_turn(env)


def check_cold_start(asked: str, env: Env) -> None:
    """Refuse ``--cold-start`` values, and ``sft`` where the environment cannot write the
    demonstrations (before anything loads)."""
    if asked not in COLD_STARTS:
        raise PosttrainError(f"--cold-start {asked!r}: expected one of {', '.join(COLD_STARTS)}")
    if asked == "self" and is_multi_turn(env):
        raise PosttrainError(
            f"--cold-start self fine-tunes on single replies and {env.name!r} plays "
            "episodes: use --cold-start none")
    if asked == "sft":
        if is_multi_turn(env):
            raise PosttrainError(
                f"--cold-start sft writes single replies and {env.name!r} plays episodes: "
                "use --cold-start none (or train an SFT run on whole conversations first "
                "and pass --from-run)")
        require_hook(env, ReferenceAgentSource, "has no reference agent to cold-start from",
                     "use --cold-start none, or give the environment a reference_agent")


def choose_cold_start(asked: str, env: Env, base_rows: list[dict[str, Any]],
                      *, from_run: str | None = None) -> ColdStartChoice:
    """``--cold-start``'s answer for this run (see the module docstring)."""
    signal = read_signal(base_rows)
    if asked == "none":
        return ColdStartChoice(False, "--cold-start none", signal)
    if asked == "sft":
        return ColdStartChoice(True, "--cold-start sft", signal)
    if asked == "self":
        return ColdStartChoice(True, "--cold-start self", signal, source="self")
    if from_run:
        return ColdStartChoice(False, f"auto: the run starts from --from-run {from_run}",
                               signal)
    low = [category for category in signal if category.shown_low()]
    if not low:
        unsure = [category for category in signal if category.seen_low()]
        if unsure:
            return ColdStartChoice(
                False, "auto: too few replies to decide: " + "; ".join(
                    f"{category.name} {category.passed} of {category.replies}, "
                    f"{category.replies_needed()} needed" for category in unsure)
                + f" to show a pass rate under {LOW_PASS_MARK:g}; RL runs from the base",
                signal)
        return ColdStartChoice(False, "auto: the base policy passes on every category ("
                               + "; ".join(category.words() for category in signal) + ")",
                               signal)
    nothing = "; ".join(category.words() for category in low)
    if is_multi_turn(env):
        return ColdStartChoice(
            False, f"auto: the base policy gives RL nothing to reinforce ({nothing}), but "
            f"environment {env.name!r} plays episodes, which no cold start here writes; RL "
            "runs from the base", signal)
    if not has_reference_agent(env):
        return ColdStartChoice(
            True, f"auto: the base policy gives RL nothing to reinforce ({nothing}) and "
            f"environment {env.name!r} has no reference agent: a cold start from the "
            "policy's own passing replies first (sampled at a higher temperature, kept "
            "where the rule passes them)", signal, source="self")
    return ColdStartChoice(True, f"auto: the base policy gives RL nothing to reinforce "
                           f"({nothing}): a supervised cold start from the reference agent "
                           "first", signal)
