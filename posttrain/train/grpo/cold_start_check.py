"""When a cold start has done enough: it stops once a sample of train prompts passes at
``--cold-start-until`` in every category (``--cold-start-check-every``).

A cold start fixed in steps is sized to the rule it was measured on. On SmolLM2 and the
refund rule 40 steps at 5e-4 left RL room (with_id 0.60, no_id 0.54); on the library rule
the same 40 steps finished the job alone (0.99: RL had nothing left to gain and read
flat), and 15 steps taught the tool call without *when* (chitchat 0.11: every chitchat
group alike, so RL could not push it back). RL learns from groups whose replies score
differently, and a category passing about half its replies has the most of them, so the
cold start stops at the first check where every category passes at least the mark on a
sample of its own train prompts (never the holdout: the verdict's prompts stay unseen).

Checks start half way through the steps (a cold start stopped sooner taught the call, not
when to make it, on both rules measured) and sample one reply per prompt, seeded, at the
evaluation's temperature and top-p, with the RNG of training left as it was: a run the
check never stops trains exactly as it would without it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback as HFTrainerCallback

from posttrain.envs.base import Env, case_of
from posttrain.policy.model_agent import ModelAgent
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.score.rows import grade
from posttrain.train.distributed import Ranks, all_true

#: Train prompts sampled per category at each check: 8 replies read a pass rate of 0.5
#: within about +-0.18 (one standard deviation), enough to tell "about half" from "none"
#: or "all", at ~25 SmolLM2 replies a check on a 2-core CPU.
PROMPTS_PER_CATEGORY = 8


@dataclass
class CategoryPasses:
    """One category's replies at one check."""

    passed: int
    replies: int

    @property
    def rate(self) -> float:
        return self.passed / self.replies if self.replies else 0.0


@dataclass
class CheckResult:
    """One check: the step, each category's passes, and how long sampling took."""

    step: int
    by_category: dict[str, CategoryPasses]
    seconds: float

    def reached(self, mark: float) -> bool:
        return bool(self.by_category) and all(
            passes.rate >= mark for passes in self.by_category.values())

    def words(self) -> str:
        return ", ".join(f"{name} {passes.passed}/{passes.replies}"
                         for name, passes in sorted(self.by_category.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seconds": round(self.seconds, 1),
                "by_category": {name: {"passed": passes.passed, "replies": passes.replies}
                                for name, passes in sorted(self.by_category.items())}}


def category_of(env: Env, record: dict[str, Any]) -> str:
    return str(env.category(case_of(env, record)))


def check_prompts(env: Env, train: list[dict[str, Any]], seed: int,
                  per_category: int = PROMPTS_PER_CATEGORY) -> list[dict[str, Any]]:
    """Up to ``per_category`` train prompts of each category, drawn with ``seed``
    (distinct prompts: the train set repeats a prompt when it is drawn twice)."""
    by_category: dict[str, dict[str, dict[str, Any]]] = {}
    for record in train:
        by_category.setdefault(category_of(env, record), {}).setdefault(record["prompt"],
                                                                        record)
    draw = random.Random(seed)
    chosen: list[dict[str, Any]] = []
    for name in sorted(by_category):
        records = list(by_category[name].values())
        chosen += draw.sample(records, min(per_category, len(records)))
    return chosen


def first_check_step(steps: int, every: int) -> int:
    """The first step a check runs at: ``every``'s first multiple from half the steps on."""
    half = max(1, steps // 2)
    return -(-half // every) * every


@dataclass
class ColdStartCheck(HFTrainerCallback):  # type: ignore[misc]
    """Stops the cold start's SFT trainer at the first check where every category of the
    sampled train prompts passes at ``until`` or more (module docstring). ``until`` 0 or
    ``every`` 0: no check, every step runs."""

    env: Env
    prompts: list[dict[str, Any]]
    policy: Policy
    sampling: SamplingParams
    steps: int
    until: float
    every: int
    seed: int = 0
    ranks: Ranks = field(default_factory=Ranks)
    say: Any = print
    checks: list[CheckResult] = field(default_factory=list)
    stopped_at: int | None = None

    @property
    def active(self) -> bool:
        return self.until > 0 and self.every > 0 and bool(self.prompts)

    def due(self, step: int) -> bool:
        return (self.active and step < self.steps and step >= first_check_step(
            self.steps, self.every) and step % self.every == 0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        step = int(state.global_step)
        if not self.due(step):
            return
        result = self.check(step, model if model is not None else self.policy.model)
        self.checks.append(result)
        reached = all_true(result.reached(self.until), self.ranks)
        verdict = (f"every category at {self.until:g} or more: cold start stops here"
                   if reached else f"not yet every category at {self.until:g}")
        self.say(f"cold start: step {step}: train sample {result.words()} -> {verdict}")
        if reached:
            self.stopped_at = step
            control.should_training_stop = True

    def check(self, step: int, model: Any) -> CheckResult:
        """One reply per sampled prompt, graded; training's RNG state is restored after."""
        import torch

        started = time.perf_counter()
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=[]):
                policy = Policy(model=model, tokenizer=self.policy.tokenizer,
                                name=self.policy.name, device=self.policy.device,
                                dtype=self.policy.dtype)
                rows = grade(self.env, self.prompts, ModelAgent(policy, self.sampling), 1,
                             seed=self.seed)
        finally:
            if was_training:
                model.train()
        by_category: dict[str, CategoryPasses] = {}
        for row in rows:
            passes = by_category.setdefault(str(row["category"]), CategoryPasses(0, 0))
            passes.replies += 1
            passes.passed += int(row["reward"])
        return CheckResult(step, by_category, time.perf_counter() - started)

    def to_dict(self) -> dict[str, Any]:
        return {"until": self.until, "every": self.every, "stopped_at": self.stopped_at,
                "checks": [result.to_dict() for result in self.checks]}
