"""vf-arith: a classic-API verifiers environment (``load_environment() -> vf.Environment``).

Each prompt asks for a sum or a product of two numbers; the reply must give the result
inside ``<answer>...</answer>``. The rubric is the usual verifiers shape: a correctness
function (weight 1.0) and the parser's format reward (weight 0.2), so a right answer in
the right format scores 1.2 and a wrong one in the right format 0.2. ``info["category"]``
names the operation, so posttrain reports the two kinds of question apart (verifiers
0.3.1 reads a ``task`` column and ``info["task"]`` as a JSON payload, not as a label).

``load_environment(count=60, seed=0, ops=["+", "*"], tools=False)``; posttrain passes
these with ``--env-arg count=100`` and so on. ``tools=true`` makes it a ``ToolEnv`` with two
calculator tools, ``add`` and ``multiply`` (plain Python functions): the same questions and
rubric, played as multi-turn episodes (call a tool, read its result, answer).
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = (
    "You are a careful calculator. Work the question out, then give only the number "
    "inside <answer></answer> tags, e.g. <answer>42</answer>."
)
OPERATIONS = {"+": ("add", "What is {a} plus {b}?"),
              "*": ("multiply", "What is {a} times {b}?")}


def questions(count: int, seed: int, ops: list[str]) -> list[dict]:
    """``count`` questions, the same for the same seed."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        op = ops[index % len(ops)]
        a, b = rng.randint(2, 60), rng.randint(2, 30)
        task, template = OPERATIONS[op]
        rows.append({"question": template.format(a=a, b=b),
                     "answer": str(a + b if op == "+" else a * b),
                     "info": {"category": task, "a": a, "b": b, "op": op}})
    return rows


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return int(a) + int(b)


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return int(a) * int(b)


TOOL_PROMPT = (
    "You are a careful calculator with two tools, add and multiply. Call the one the "
    "question needs, then give only its result inside <answer></answer> tags, "
    "e.g. <answer>42</answer>."
)


def load_environment(count: int = 60, seed: int = 0, ops: list[str] | None = None,
                     tools: bool = False, **kwargs) -> vf.Environment:
    ops = list(ops or OPERATIONS)
    unknown = [op for op in ops if op not in OPERATIONS]
    if unknown:
        raise ValueError(f"ops: unknown operation(s) {unknown}; use any of {list(OPERATIONS)}")
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion, answer, **_kwargs) -> float:
        given = parser.parse_answer(completion)
        return 1.0 if given is not None and given.strip() == str(answer).strip() else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()],
                       weights=[1.0, 0.2], parser=parser)
    dataset = Dataset.from_list(questions(count, seed, ops))
    if tools:
        return vf.ToolEnv(dataset=dataset, system_prompt=TOOL_PROMPT, parser=parser,
                          rubric=rubric, tools=[add, multiply], max_turns=4, **kwargs)
    return vf.SingleTurnEnv(dataset=dataset, system_prompt=SYSTEM_PROMPT, parser=parser,
                            rubric=rubric, **kwargs)
