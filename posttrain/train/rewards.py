"""The environment's rule as a TRL reward function, remembering the last batch it scored.

TRL calls a reward function as ``fn(completions, **dataset_columns)``. With
conversational prompts each completion is ``[{"role": "assistant", "content": ...}]``.
The reward is the raw rule score (0, 0.2, 0.3, ... 1.0): finer than the 0/1 pass,
so a group whose replies all fail can still carry signal toward the right move.
The hack monitor scans the last scored batch, which this object keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, passes


def completion_text(completion: Any) -> str:
    """The reply text of one TRL completion (conversational or plain string)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(
            str(message.get("content") or "") for message in completion if isinstance(message, dict)
        )
    return str(completion)


@dataclass
class RuleReward:
    """Callable reward for TRL. ``last_batch`` holds the graded rows of the latest call,
    ``history`` every row scored so far (the monitor scans the part since its last look)."""

    env: Env
    last_batch: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0

    @property
    def __name__(self) -> str:  # TRL names the logged metric rewards/<__name__>/mean
        return "rule"

    def __call__(
        self, completions: list[Any], prompt_text: list[str], scenario_id: list[str], **_: Any
    ) -> list[float]:
        rows = []
        for completion, prompt, scenario in zip(completions, prompt_text, scenario_id, strict=True):
            reply = completion_text(completion)
            case = self.env.case_for(prompt)
            score = self.env.score(reply, case)
            rows.append(
                {
                    "prompt": prompt,
                    "scenario_id": scenario,
                    "category": self.env.category(case),
                    "reply": reply,
                    "score": score,
                    "reward": 1 if passes(score) else 0,
                    "markers": self.env.markers(reply, case),
                }
            )
        self.last_batch = rows
        self.history.extend(rows)
        self.calls += 1
        return [row["score"] for row in rows]
