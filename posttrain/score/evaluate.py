"""Evaluate a policy on a prompt set: k seeded samples per prompt, optionally repeated.

Repeats re-sample the same policy with different sampling seeds
(``eval_run`` 0, 1, ...). Run 0 is the evaluation; the others exist to measure
how much pass@1 moves when nothing but the sampling seed changes (the noise
band a delta must clear before it reads ``moved``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from posttrain.envs.base import Env
from posttrain.progress import progress_bar
from posttrain.score.rows import grade


@dataclass
class Evaluation:
    """Graded rows of each evaluation run of one policy."""

    runs: list[list[dict[str, Any]]]
    seconds: float = 0.0

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Rows of the first run: the evaluation the report pairs against."""
        return self.runs[0]


def evaluate(
    env: Env,
    prompts: list[dict[str, Any]],
    agent: Any,
    *,
    samples: int = 4,
    seed: int = 0,
    repeats: int = 1,
    first_repeat: int = 0,
    label: str = "evaluating",
    show_progress: bool = True,
) -> Evaluation:
    """Grade ``samples`` replies per prompt, ``repeats`` times with different seeds:
    evaluation runs ``first_repeat`` .. ``first_repeat + repeats - 1``, so the repeats of
    one policy can be taken in two calls and read the same as in one."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if first_repeat < 0:
        raise ValueError(f"first_repeat must be at least 0, got {first_repeat}")
    started = time.monotonic()
    per_run = len(prompts) * samples
    runs = []
    with progress_bar(label, per_run * repeats, enabled=show_progress) as update:
        for index, eval_run in enumerate(range(first_repeat, first_repeat + repeats)):
            done_before = index * per_run
            runs.append(
                grade(
                    env,
                    prompts,
                    agent,
                    samples,
                    seed=seed,
                    eval_run=eval_run,
                    progress=lambda done, total, base=done_before: update(base + done),
                )
            )
    return Evaluation(runs=runs, seconds=time.monotonic() - started)
