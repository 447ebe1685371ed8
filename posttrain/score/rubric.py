"""The reward pipeline, defined once: a rubric of weighted reward functions over a reply and
its case, then the group advantages an RL update weighs each sample by.

In the field's words (verifiers' ``Rubric``): a reward is a weighted sum of reward
functions, each ``fn(reply, case) -> float``. posttrain's default rubric is one function,
the environment's own rule score, at weight 1 (``rule_rubric``); ``--reward
module:function`` swaps in the user's function (``training_rubric``), while the holdout is
still graded by the rule, which is how the hack monitor sees a reward that pays for the
wrong thing. Both trainers call this module: GRPO on TRL scores completions through
``posttrain.train.rewards.RuleReward`` (a TRL reward function wrapping a ``Rubric``), and
the primitives service's RL loop scores its samples with the same ``Rubric`` and takes its
advantages from ``group_mean_advantages`` / ``leave_one_out_advantages`` below (the
service re-exports them under the seed's names, for callers of its client).

Advantages. ``group_mean_advantages`` is GRPO's ``r - mean(r)``, divided by the group's
standard deviation when ``normalize_std`` (Dr. GRPO leaves it out). TRL's GRPOTrainer
computes the same thing inside its training step, with two differences worth knowing: it
divides by the *sample* standard deviation (Bessel's G - 1) plus 1e-4, where this module
divides by the population one (over the G samples) and maps a uniform group to zeros. For
a group of G samples the two differ by the constant factor sqrt((G - 1) / G) (0.935 at
G = 8), which acts as a learning-rate scale; ``trl_scale_rewards`` names the same
on/off choice in TRL's vocabulary so the recipe's flag and the service's loop agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.envs.base import Env
from posttrain.errors import PosttrainError
from posttrain.text import echo, short_line

#: a reward function: the reply text and its case (ground truth) -> a finite number
RewardFunction = Callable[[str, dict[str, Any]], float]


@dataclass(frozen=True)
class RewardTerm:
    """One weighted function of a rubric; ``name`` labels its metric."""

    name: str
    function: RewardFunction
    weight: float = 1.0


@dataclass(frozen=True)
class Rubric:
    """A reward as the weighted sum of its terms (at least one)."""

    terms: tuple[RewardTerm, ...]

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a rubric needs at least one reward function")
        for term in self.terms:
            if not math.isfinite(term.weight):
                raise ValueError(f"reward term {term.name!r}: weight {term.weight!r} is not "
                                 "a finite number")

    @property
    def name(self) -> str:
        """The rubric's label (TRL logs ``rewards/<name>/mean``): the single term's name, or
        ``"rubric"`` for a weighted sum."""
        return self.terms[0].name if len(self.terms) == 1 else "rubric"

    def term_values(self, reply: str, case: dict[str, Any]) -> dict[str, float]:
        """Each term's value (before its weight), by name. Raises ``PosttrainError`` when
        a function returns anything but a finite number."""
        return {term.name: _checked(term, _called(term, reply, case)) for term in self.terms}

    def score(self, reply: str, case: dict[str, Any]) -> float:
        """The reward of one reply: the weighted sum of the terms' values (a single term at
        weight 1 is its value, unchanged)."""
        values = self.term_values(reply, case)
        if len(self.terms) == 1 and self.terms[0].weight == 1.0:
            return values[self.terms[0].name]
        return sum(term.weight * values[term.name] for term in self.terms)


def _called(term: RewardTerm, reply: str, case: dict[str, Any]) -> Any:
    """The term's function on one reply; what it raises becomes one line naming it."""
    try:
        return term.function(reply, case)
    except PosttrainError:
        raise
    except Exception as error:  # the user's reward function: say which, in one line
        what = "the training reward" + ("" if term.name in ("rule", "reward")
                                        else f" ({term.name})")
        raise PosttrainError(f"{what} raised {type(error).__name__} on a reply: "
                             f"{short_line(error)}") from None


def _checked(term: RewardTerm, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise PosttrainError(
            f"the training reward returned {echo(value)} for a reply; it must return a "
            "finite number" + ("" if term.name in ("rule", "reward") else f" ({term.name})")
        )
    return float(value)


def rule_rubric(env: Env) -> Rubric:
    """The environment's rule score as the whole reward (posttrain's default)."""
    return Rubric((RewardTerm("rule", env.score),))


def training_rubric(env: Env, function: RewardFunction | None = None) -> Rubric:
    """The reward a recipe trains on: ``function`` (``--reward``) when given, else the
    environment's rule."""
    return rule_rubric(env) if function is None else Rubric((RewardTerm("reward", function),))


# ---------------------------------------------------------------- advantages


def group_mean_advantages(rewards: Sequence[float], normalize_std: bool = True) -> list[float]:
    """GRPO advantages of one group: ``r - mean(r)``, divided by the group's standard
    deviation (population, over the G samples) when ``normalize_std``.

    A uniform group gives all zeros (never a division by zero). ``normalize_std=False`` is
    Dr. GRPO's choice: the std scaling up-weights nearly uniform groups.
    """
    if not rewards:
        raise ValueError("a group needs at least one reward")
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / std if std > 1e-12 else 0.0 for c in centred]


def leave_one_out_advantages(rewards: Sequence[float]) -> list[float]:
    """RLOO advantages: each reward minus the mean of the *other* rewards of its group.

    Equal to ``G / (G - 1) * (r - mean(r))``; needs at least two samples.
    """
    count = len(rewards)
    if count < 2:
        raise ValueError("leave-one-out needs at least two samples per group")
    total = sum(rewards)
    return [r - (total - r) / (count - 1) for r in rewards]


def all_zero(advantages: Sequence[float], tolerance: float = 1e-12) -> bool:
    """True when every advantage is (numerically) zero: no gradient signal."""
    return all(abs(a) <= tolerance for a in advantages)


def trl_scale_rewards(normalize_std: bool) -> str:
    """The same choice as ``group_mean_advantages(normalize_std=...)`` in TRL's vocabulary
    (``GRPOConfig.scale_rewards``): ``"group"`` or ``"none"``."""
    return "group" if normalize_std else "none"
