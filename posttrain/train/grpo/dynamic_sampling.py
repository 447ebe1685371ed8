"""Dynamic sampling: dead groups sampled again, within a budget (``--resample-dead-groups``).

A GRPO group whose replies all score the same has zero advantage and teaches nothing
(``signal_watch``). DAPO's dynamic sampling keeps drawing until the batch holds only
groups with signal. Here, inside posttrain's rollout (``rollout.py``), each dead group is
sampled again, with fresh seeds, up to ``rounds`` times; the first redraw whose replies
score differently replaces it, and a group still dead after the budget keeps its last
draw (TRL's batch keeps its shape: same prompts, same group size). The redraws of one
round go to the sampler together, so a round costs one batched call.

What it costs and buys is measured, not assumed: every round's redraws and the groups they
revived are counted (``ResampleCount``, in the run's summary). It is off by default; see
benchmarks/RESULTS.md for the runs that decide whether it earns a default.

Bias, as in DAPO: a group is kept because its replies disagree, so the kept batch
over-represents prompts the policy is unsure of. That is the point (those are the groups
with a gradient); it also means the step's mean reward is not the policy's pass rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

Draw = TypeVar("Draw")

#: ``redraw(groups, round)`` -> for each group index asked, ``group_size`` fresh draws
#: and their scores
Redraw = Callable[[list[int], int], dict[int, tuple[list[Any], list[float]]]]


def dead_groups(scores: Sequence[float], group_size: int) -> list[int]:
    """Indexes of the groups (consecutive runs of ``group_size`` scores) that all scored
    the same."""
    if group_size < 1 or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    return [group for group in range(len(scores) // group_size)
            if len(set(scores[group * group_size:(group + 1) * group_size])) == 1]


@dataclass
class ResampleCount:
    """What dynamic sampling did over a run (kept in the summary)."""

    rounds: int  # the budget: redraws a dead group may get
    steps: int = 0
    groups: int = 0
    dead: int = 0  # dead before any redraw
    revived: int = 0  # of those, revived by a redraw
    redraws: int = 0  # groups drawn again, over all rounds
    per_round: list[int] = field(default_factory=list)  # groups revived by round 1, 2, ...

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "steps": self.steps, "groups": self.groups,
                "dead": self.dead, "revived": self.revived, "redraws": self.redraws,
                "revived_by_round": list(self.per_round)}

    def words(self) -> str:
        if not self.dead:
            return (f"dynamic sampling: no dead group in {self.groups} groups over "
                    f"{self.steps} steps")
        return (f"dynamic sampling: {self.revived} of {self.dead} dead groups revived by "
                f"{self.redraws} group redraws (up to {self.rounds} each) over {self.steps} "
                f"steps; {self.dead - self.revived} stayed dead")


def resample_dead(draws: list[Draw], scores: list[float], group_size: int, rounds: int,
                  redraw: Redraw, count: ResampleCount | None = None
                  ) -> tuple[list[Draw], list[float]]:
    """``draws`` and their ``scores`` (groups of ``group_size`` in a row) with each dead
    group drawn again by ``redraw`` up to ``rounds`` times, replaced by the first redraw
    that scores differently, else by its last redraw. Returns new lists; ``count``, when
    given, adds this step's numbers."""
    draws, scores = list(draws), list(scores)
    pending = dead_groups(scores, group_size)
    count = count if count is not None else ResampleCount(rounds)
    count.steps += 1
    count.groups += len(scores) // group_size
    count.dead += len(pending)
    for number in range(1, rounds + 1):
        if not pending:
            break
        fresh = redraw(pending, number)
        count.redraws += len(pending)
        still = []
        for group in pending:
            new_draws, new_scores = fresh[group]
            if len(new_draws) != group_size or len(new_scores) != group_size:
                raise ValueError(f"a redraw of group {group} gave {len(new_draws)} draws and "
                                 f"{len(new_scores)} scores, not {group_size}")
            start = group * group_size
            draws[start:start + group_size] = new_draws
            scores[start:start + group_size] = new_scores
            if len(set(new_scores)) == 1:
                still.append(group)
        revived = len(pending) - len(still)
        while len(count.per_round) < number:
            count.per_round.append(0)
        count.per_round[number - 1] += revived
        count.revived += revived
        pending = still
    return draws, scores
