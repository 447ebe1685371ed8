"""vf-arith-v1: the vf-arith questions written against verifiers' v1 API (``Taskset`` /
``Task``, what verifiers 0.4 keeps and the Hub's newer packages use).

A task's data carries the question, its answer and its category; the task's reward reads
the answer from ``<answer>...</answer>`` in the last reply, its stop condition ends the
rollout after one turn. The taskset is exported through ``__all__``, as verifiers' loader
wants. posttrain loads it as ``--env verifiers:vf-arith-v1`` (``--env-arg count=80``).
"""

from __future__ import annotations

import re

import verifiers.v1 as vf
from pydantic import Field
from vf_arith import OPERATIONS, SYSTEM_PROMPT, questions

_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class ArithData(vf.TaskData):
    answer: str
    category: str


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def correct(self, trace) -> float:
        found = _ANSWER.search(trace.last_reply)
        return float(found is not None and found.group(1) == self.data.answer)


class ArithConfig(vf.TasksetConfig):
    count: int = 60
    seed: int = 0
    ops: list[str] = Field(default_factory=lambda: list(OPERATIONS))


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        rows = questions(self.config.count, self.config.seed, list(self.config.ops))
        return [ArithTask(ArithData(prompt=row["question"], system_prompt=SYSTEM_PROMPT,
                                    answer=row["answer"], category=row["info"]["category"]),
                          self.config.task)
                for row in rows]


__all__ = ["ArithTaskset"]
