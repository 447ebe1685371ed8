"""``--cold-start self``: a cold start from the policy's own successes (expert iteration).

An environment without a reference agent (a verifiers, inspect or OpenEnv environment, or
a rule a user brings) leaves the reference cold start nothing to learn from. What the
policy does now can still hold the move: a base that passes 0 of 88 replies at its
evaluation temperature may pass a few of hundreds at a higher one (pass@k). So, for the
categories the base does not pass (the plan's evidence; every category when asked for
``self`` with none low):

1. sample ``--cold-start-samples`` replies to each of up to ``--cold-start-prompts``
   train prompts per category at ``--cold-start-temperature``, grade them by the rule,
   and keep the passing ones (each distinct reply once);
2. fine-tune on every reply kept so far (a fresh LoRA adapter, merged in), then sample
   again from the fine-tuned policy;
3. repeat while a round finds replies it had not (at most ``--cold-start-rounds``).

Where a round's plain samples of a category find nothing, the same prompts are sampled
again with each reply opened by a call of one of the environment's tools
(``cold_start_hint``; ``--cold-start-hint none`` turns it off), and a passing reply is
kept as the reply to the plain prompt.

The categories the base passes are sampled once too (``--cold-start-anchor-samples`` a
prompt), and their passing replies join each round's demonstrations, about as many a
category as a mined category has: fine-tuned on the mined tool calls alone, SmolLM2 on
the library rule passed 0 of 8 chit-chat prompts of the cold start's check after 10 steps
(RESULTS.md).

Each round prints, per category, how many passing replies it found in how many samples;
a category where nothing passes in the budget is said plainly and RL trains on the rest.
The merged policy is then evaluated on the holdout like the reference cold start's
(``cold_start.finish_cold_start``): RL's baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.policy.model_agent import ModelAgent, default_max_new_tokens
from posttrain.policy.sampler import SamplingParams
from posttrain.progress import progress_bar
from posttrain.score.rows import grade
from posttrain.train.context import RecipeContext
from posttrain.train.grpo.cold_start_hint import OpenedReplyAgent
from posttrain.train.training_data.demos import Demo

#: epochs over the replies kept so far that one round's fine-tuning takes (within
#: ``--cold-start-steps``): a handful of found replies is not trained on for 40 steps
SELF_EPOCHS = 3


@dataclass
class CategoryFind:
    """One round's sampling of one category: plain samples drawn and passing, the same
    with the reply opened by a tool call (``cold_start_hint``), replies new to the round
    (not found in an earlier one), and on how many prompts any passed."""

    name: str
    prompts: int = 0
    samples: int = 0
    passed: int = 0
    new: int = 0
    prompts_passed: int = 0
    opened_samples: int = 0
    opened_passed: int = 0

    def found(self) -> int:
        return self.passed + self.opened_passed

    def words(self) -> str:
        line = f"{self.name} {self.passed} passing of {self.samples} samples"
        if self.opened_samples:
            line += (f", {self.opened_passed} of {self.opened_samples} with the reply opened "
                     "by a tool call")
        if not self.found():
            return line
        return f"{line} ({self.new} new; on {self.prompts_passed} of {self.prompts} prompts)"


@dataclass
class SelfRound:
    """One round: what it found, by category, and the fine-tuning that followed."""

    index: int
    finds: list[CategoryFind]
    kept: int = 0  # replies trained on after this round (every round's so far)
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.index, "kept": self.kept, "steps": self.steps,
                "categories": [vars(find) for find in self.finds]}


@dataclass
class SelfMining:
    """Every round of a self cold start, and the anchors: the passing replies found once
    in the categories the base passes."""

    categories: list[str]
    rounds: list[SelfRound] = field(default_factory=list)
    anchors: list[CategoryFind] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": "self", "categories": self.categories,
                "rounds": [entry.to_dict() for entry in self.rounds],
                "anchors": [vars(find) for find in self.anchors]}

    def nothing_in(self) -> list[str]:
        """The categories no round found a passing reply for."""
        found = {find.name for entry in self.rounds for find in entry.finds if find.found()}
        return [name for name in self.categories if name not in found]


def mined_categories(choice_signal: list[Any]) -> list[str]:
    """The categories a self cold start samples: those the base's first evaluation saw
    under the mark, else every category (``--cold-start self`` on a base that passes)."""
    low = [category.name for category in choice_signal if category.seen_low()]
    return low or [category.name for category in choice_signal]


def anchor_categories(choice_signal: list[Any], mined: list[str]) -> list[str]:
    """The categories the base passes: every category the self cold start does not mine."""
    return [category.name for category in choice_signal if category.name not in mined]


def anchored(demos: list[Demo], anchors: list[Demo], mined: int) -> list[Demo]:
    """``demos`` (the mined categories', ``mined`` of them) with the anchors: up to the
    mean a mined category has, of each anchor category, in the order they were found."""
    if not demos or not anchors:
        return list(demos)
    each = math.ceil(len(demos) / max(1, mined))
    taken: dict[str, int] = {}
    chosen = []
    for demo in anchors:
        category = str(demo.get("category"))
        if taken.get(category, 0) < each:
            taken[category] = taken.get(category, 0) + 1
            chosen.append(demo)
    return [*demos, *chosen]


def mining_prompts(train: list[dict[str, Any]], categories: list[str], per_category: int
                   ) -> list[dict[str, Any]]:
    """Up to ``per_category`` train prompts of each category mined, in the train order
    (which the run's data seed set)."""
    chosen: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for record in train:
        name = str(record.get("category"))
        if name in categories and counts.get(name, 0) < per_category:
            counts[name] = counts.get(name, 0) + 1
            chosen.append(record)
    return chosen


def sample_round(context: RecipeContext[Any], settings: Any, records: list[dict[str, Any]],
                 round_index: int, openings: list[str] | None = None) -> list[dict[str, Any]]:
    """``--cold-start-samples`` graded replies to each record from the policy as it is now,
    at ``--cold-start-temperature`` (seeded by the run's seed and the round); with
    ``openings``, each reply begun by one of them (``cold_start_hint``), seeded apart."""
    policy = context.policy
    params = SamplingParams(temperature=settings.cold_start_temperature, top_p=1.0,
                            max_new_tokens=default_max_new_tokens(policy))
    agent = OpenedReplyAgent(policy, params, openings) if openings else ModelAgent(policy,
                                                                                   params)
    was_training = policy.model.training
    policy.model.eval()
    total = len(records) * settings.cold_start_samples
    what = "sampling with tool calls opened" if openings else "sampling"
    which = f"round {round_index}" if round_index else "anchors"
    try:
        with progress_bar(f"cold start (self): {which} {what}", total,
                          enabled=context.ranks.is_main) as update:
            rows = grade(context.env, records, agent, k=settings.cold_start_samples,
                         seed=settings.seed * 1000 + round_index + (500 if openings else 0),
                         progress=lambda done, _total: update(done))
    finally:
        if was_training:
            policy.model.train()
    if openings:
        for row in rows:
            row["opened"] = True
    return rows


def keep_passing(context: RecipeContext[Any], rows: list[dict[str, Any]],
                 categories: list[str], seen: set[tuple[str, str]], demos: list[Demo]
                 ) -> list[CategoryFind]:
    """Add each passing reply not kept before to ``demos`` (as the reply to the plain
    prompt, whether its reply was opened for it or not: a row marked ``opened``); the
    round's finds by category."""
    finds = {name: CategoryFind(name) for name in categories}
    prompts: dict[str, set[str]] = {name: set() for name in categories}
    passed_on: dict[str, set[str]] = {name: set() for name in categories}
    for row in rows:
        find = finds[str(row["category"])]
        opened = bool(row.get("opened"))
        if opened:
            find.opened_samples += 1
        else:
            find.samples += 1
        prompts[find.name].add(row["prompt"])
        if row["reward"] != 1:
            continue
        if opened:
            find.opened_passed += 1
        else:
            find.passed += 1
        passed_on[find.name].add(row["prompt"])
        key = (row["prompt"], row["reply"])
        if key in seen:
            continue
        seen.add(key)
        find.new += 1
        demos.append({"prompt": context.env.messages_for(row["prompt"]),
                      "completion": [{"role": "assistant", "content": row["reply"]}],
                      "scenario_id": row["scenario_id"], "category": find.name})
    for name, find in finds.items():
        find.prompts, find.prompts_passed = len(prompts[name]), len(passed_on[name])
    return list(finds.values())


def unfound(rows: list[dict[str, Any]], categories: list[str]) -> list[str]:
    """The categories no row passes in (a round's plain samples)."""
    passing = {str(row["category"]) for row in rows if row["reward"] == 1}
    return [name for name in categories if name not in passing]


def round_steps(settings: Any, kept: int, batch_size: int) -> int:
    """A round's fine-tuning steps: ``SELF_EPOCHS`` over the replies kept so far, within
    ``--cold-start-steps``."""
    return max(1, min(settings.cold_start_steps, math.ceil(SELF_EPOCHS * kept / batch_size)))
