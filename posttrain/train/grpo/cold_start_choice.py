"""Whether a GRPO run begins with a supervised cold start (``--cold-start none|auto|sft``),
read from the base policy's holdout rows; the cold start itself is ``cold_start.py``.

GRPO learns only from groups whose replies score differently. A real model that never
does what the rule pays for on some kind of prompt (SmolLM2-135M never calls the refund
tool: none of its with-id replies pass, every group scores alike) gives RL nothing to
reinforce there. ``read_signal`` reads the baseline phase's rows: per category, how many
replies passed and how many groups (one prompt's samples in one evaluation) scored all
alike. ``choose_cold_start``: ``sft`` always, ``none`` never, ``auto`` when some category
has replies and none of them passed, the environment has a reference agent and the run
does not start from ``--from-run`` (without a reference agent the run says it cannot
cold-start and trains from the base).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, ReferenceAgentSource, has_hook, is_multi_turn, require_hook
from posttrain.errors import PosttrainError

COLD_STARTS = ("none", "auto", "sft")


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

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "reason": self.reason,
                "signal": [vars(category) for category in self.signal]}


def has_reference_agent(env: Env) -> bool:
    return has_hook(env, ReferenceAgentSource) and not is_multi_turn(env)


def check_cold_start(asked: str, env: Env) -> None:
    """Refuse ``--cold-start`` values, and ``sft`` where the environment cannot write the
    demonstrations (before anything loads)."""
    if asked not in COLD_STARTS:
        raise PosttrainError(f"--cold-start {asked!r}: expected one of {', '.join(COLD_STARTS)}")
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
    if from_run:
        return ColdStartChoice(False, f"auto: the run starts from --from-run {from_run}",
                               signal)
    silent = [category for category in signal if category.replies and not category.passed]
    if not silent:
        return ColdStartChoice(False, "auto: the base policy passes on every category ("
                               + "; ".join(category.words() for category in signal) + ")",
                               signal)
    nothing = "; ".join(category.words() for category in silent)
    if not has_reference_agent(env):
        return ColdStartChoice(
            False, f"auto: the base policy gives RL nothing to reinforce ({nothing}), but "
            f"environment {env.name!r} has no reference agent to cold-start from; RL runs "
            "from the base", signal)
    return ColdStartChoice(True, f"auto: the base policy gives RL nothing to reinforce "
                           f"({nothing}): a supervised cold start from the reference agent "
                           "first", signal)
