"""verifiers environments posttrain must refuse, one per ``kind`` (load_environment(kind=)),
and one it plays (``plain``).

Loaded by tests/test_ecosystem_verifiers.py as ``--env verifiers:vf-cases?kind=...``.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset
from openai import AsyncOpenAI

# six rows: enough for eval's data step to hold one out
ROWS = [{"question": f"What is {n} plus {n + 2 * (n > 2)}?", "answer": str(2 * n + 2 * (n > 2))}
        for n in range(2, 8)]


def exact(completion, answer, **_kwargs) -> float:
    return float(str(completion[-1]["content"] if isinstance(completion[-1], dict)
                     else completion[-1].content).strip() == answer)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class EchoEnv(vf.MultiTurnEnv):
    """A multi-turn environment whose turns are its own code."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Are you sure?"}]


class CheckedToolEnv(vf.ToolEnv):
    """A ToolEnv whose env_response is its own code (it checks the calls first)."""

    async def env_response(self, messages, state, **kwargs):
        return await super().env_response(messages, state, **kwargs)


class CounterEnv(vf.StatefulToolEnv):
    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        return tool_args


def load_environment(kind: str = "plain", **kwargs) -> vf.Environment:
    data = Dataset.from_list(ROWS)
    if kind == "plain":
        return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[exact]))
    if kind == "judged":
        # a judge the environment names (an address nothing answers on): posttrain refuses
        # it, or points it at --env-judge-endpoint
        judge = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
        rubric = vf.JudgeRubric(judge_client=judge, judge_model="house-judge")

        async def judged_correct(judge, prompt, completion, answer, state) -> float:
            verdict = await judge(prompt, completion, answer, state)
            return 1.0 if verdict.strip().lower().startswith("yes") else 0.0

        rubric.add_reward_func(judged_correct)
        return vf.SingleTurnEnv(dataset=data, rubric=rubric)
    if kind == "grouped":
        def distinct(completions, **_kwargs) -> list[float]:
            return [1.0 / len(completions)] * len(completions)
        return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[exact, distinct]))
    if kind == "multiturn":
        return EchoEnv(dataset=data, rubric=vf.Rubric(funcs=[exact]), max_turns=3)
    if kind == "stateful":
        return CounterEnv(dataset=data, tools=[add], rubric=vf.Rubric(funcs=[exact]))
    if kind == "toolsub":
        return CheckedToolEnv(dataset=data, tools=[add], rubric=vf.Rubric(funcs=[exact]))
    if kind == "history":
        rows = [{"prompt": [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello"},
                            {"role": "user", "content": row["question"]}],
                 "answer": row["answer"]} for row in ROWS[:1]]
        rows.append({"prompt": [{"role": "user", "content": ROWS[1]["question"]}],
                     "answer": ROWS[1]["answer"]})
        return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact]))
    raise ValueError(f"unknown kind {kind!r}")
