"""inspect_ai tasks that posttrain must play or refuse, one per ``@task`` (loaded as
``inspect:tests/ecosystem_envs/inspect_cases.py@NAME``)."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import get_model
from inspect_ai.scorer import (
    CORRECT,
    INCORRECT,
    Score,
    Target,
    accuracy,
    choice,
    match,
    model_graded_qa,
    scorer,
)
from inspect_ai.solver import (
    TaskState,
    chain_of_thought,
    generate,
    multiple_choice,
    system_message,
    use_tools,
)
from inspect_ai.tool import bash, tool


def _samples(count: int = 4) -> list[Sample]:
    return [Sample(id=index, input=f"What is {index} plus {index}?", target=str(2 * index),
                   metadata={"category": "even" if index % 2 == 0 else "odd"})
            for index in range(1, count + 1)]


@tool
def add():
    async def execute(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    return execute


@scorer(metrics=[accuracy()])
def parts():
    """A scorer with a dict value: the answer, and the reply's brevity."""

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        return Score(value={"answer": CORRECT if target.text in text else INCORRECT,
                            "short": CORRECT if len(text) < 20 else INCORRECT})

    return score


@scorer(metrics=[accuracy()])
def asks_a_model():
    """A custom scorer that grades with a model (posttrain runs none)."""

    async def score(state: TaskState, target: Target) -> Score:
        answer = await get_model().generate(state.output.completion)
        return Score(value=CORRECT if "yes" in answer.completion else INCORRECT)

    return score


@task
def templated() -> Task:
    return Task(dataset=MemoryDataset(_samples()),
                solver=[system_message("Answer briefly."), chain_of_thought(), generate()],
                scorer=match(numeric=True))


@task
def dict_valued() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=generate(), scorer=parts())


@task
def sandboxed() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=generate(), scorer=match(),
                sandbox="docker")


@task
def graded() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=generate(), scorer=model_graded_qa())


@task
def custom_graded() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=generate(), scorer=asks_a_model())


@task
def tooled() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=[use_tools(add()), generate()],
                scorer=match())


@task
def builtin_tool() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=[use_tools(bash()), generate()],
                scorer=match())


@task
def choices() -> Task:
    samples = [Sample(input="2 + 2?", choices=["3", "4"], target="B")]
    return Task(dataset=MemoryDataset(samples), solver=multiple_choice(), scorer=choice())


@task
def unscored() -> Task:
    return Task(dataset=MemoryDataset(_samples()), solver=generate())


@task
def per_sample_system() -> Task:
    return Task(dataset=MemoryDataset(_samples()),
                solver=[system_message("You answer {category} sums."), generate()],
                scorer=match())


@task
def file_samples() -> Task:
    samples = [Sample(input="Read data.txt", target="1", files={"data.txt": "1"})]
    return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=match())
