"""inspect-arith: an inspect_ai task (``@task``) that posttrain loads as an environment.

Each sample asks for a sum or a product of two numbers; ``metadata["category"]`` names
the operation, so posttrain reports the two kinds of question apart. Two scorers, the
usual inspect shape: ``match(numeric=True)`` (the reply ends with the right number) and
``concise`` (the reply is at most 80 characters). posttrain's reward is the first
scorer's value; every scorer's value is a marker.

Run it with inspect (``inspect eval examples/inspect_arith/inspect_arith.py@arith``) or
hand it to posttrain: ``--env inspect:examples/inspect_arith/inspect_arith.py@arith``, or
``--env inspect:inspect_arith/arith`` once the package is installed
(``pip install -e examples/inspect_arith``; it registers the task through the
``inspect_ai`` entry point). Task arguments: ``--env-arg count=80``; ``tools=true`` gives
the model two tools, ``add`` and ``multiply`` (plain Python functions), and posttrain plays
the task as multi-turn episodes (call a tool, read its result, answer).
"""

from __future__ import annotations

import random

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, match, scorer
from inspect_ai.solver import TaskState, generate, system_message, use_tools
from inspect_ai.tool import tool

SYSTEM_PROMPT = ("You are a careful calculator. Answer with the number only, "
                 "e.g. 42, on one line.")
TOOL_PROMPT = ("You are a careful calculator with two tools, add and multiply. Call the "
               "one the question needs, then answer with its result only, e.g. 42.")
OPERATIONS = {"+": ("add", "What is {a} plus {b}?"),
              "*": ("multiply", "What is {a} times {b}?")}
CONCISE_CHARS = 80


def samples(count: int, seed: int, ops: list[str]) -> list[Sample]:
    """``count`` questions, the same for the same seed."""
    rng = random.Random(seed)
    made = []
    for index in range(count):
        op = ops[index % len(ops)]
        a, b = rng.randint(2, 60), rng.randint(2, 30)
        category, template = OPERATIONS[op]
        made.append(Sample(id=f"q{index:03d}", input=template.format(a=a, b=b),
                           target=str(a + b if op == "+" else a * b),
                           metadata={"category": category, "a": a, "b": b}))
    return made


@scorer(metrics=[accuracy()])
def concise():
    """C when the reply is at most CONCISE_CHARS characters long."""

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        return Score(value=CORRECT if len(text) <= CONCISE_CHARS else INCORRECT,
                     answer=text[:CONCISE_CHARS])

    return score


@tool
def add():
    async def execute(a: int, b: int) -> int:
        """Add two whole numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return int(a) + int(b)

    return execute


@tool
def multiply():
    async def execute(a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return int(a) * int(b)

    return execute


@task
def arith(count: int = 40, seed: int = 0, ops: list[str] | None = None,
          tools: bool = False) -> Task:
    ops = list(ops or OPERATIONS)
    unknown = [op for op in ops if op not in OPERATIONS]
    if unknown:
        raise ValueError(f"ops: unknown operation(s) {unknown}; use any of {list(OPERATIONS)}")
    return Task(dataset=MemoryDataset(samples(count, seed, ops), name="arith"),
                solver=([system_message(TOOL_PROMPT), use_tools(add(), multiply()), generate()]
                        if tools else [system_message(SYSTEM_PROMPT), generate()]),
                scorer=[match(numeric=True), concise()])
