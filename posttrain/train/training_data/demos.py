"""Demonstrations for the SFT recipe: from a JSONL file, or from the environment's
reference agent; never from a holdout scenario.

A demonstration is TRL's conversational *prompt-completion* record: ``prompt`` (the
messages before the reply) and ``completion`` (one assistant message), so SFTTrainer
puts the loss on the completion only. A file line is either that pair or a whole
conversation (``{"messages": [...]}``); a conversation becomes one demonstration per
assistant turn, each with everything before it as the prompt, which puts the loss on
every assistant turn and on nothing else.

The holdout is what the before/after verdict is measured on, so a demonstration of a
holdout prompt would grade the model on its own training data. ``drop_holdout_leaks``
removes every demonstration whose scenario id is a holdout scenario or whose user text
is a holdout prompt (compared without case and extra spaces), and the recipe reports
how many went.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, ReferenceAgentSource, require_hook
from posttrain.errors import InputFileError
from posttrain.jsonl import read_jsonl_objects
from posttrain.score.rows import grade

ROLES = ("system", "user", "assistant", "tool")
#: what ``--demos`` takes to use the environment's reference agent instead of a file
REFERENCE = "reference"

Demo = dict[str, Any]  # {"prompt": [messages], "completion": [message], "scenario_id": str|None}


@dataclass
class DemoReport:
    """Where the demonstrations came from and what was dropped on the way."""

    source: str
    read: int = 0  # demonstrations made before any filter
    failed_rule: int = 0  # reference replies the rule did not pass (left out)
    duplicates: int = 0
    holdout_leaks: int = 0  # dropped: a holdout scenario or prompt
    kept: int = 0
    prompts: int = 0  # distinct prompts among the kept
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "read": self.read, "failed_rule": self.failed_rule,
            "duplicates": self.duplicates, "holdout_leaks": self.holdout_leaks,
            "kept": self.kept, "prompts": self.prompts, "warnings": list(self.warnings),
        }

    def describe(self) -> str:
        dropped = [f"{count} {what}" for count, what in (
            (self.failed_rule, "failing the rule"), (self.duplicates, "duplicates"),
            (self.holdout_leaks, "on holdout prompts (left out: they would grade the model "
                                 "on its training data)"),
        ) if count]
        line = (f"demonstrations: {self.kept} kept of {self.read} from {self.source}, "
                f"{self.prompts} distinct prompts")
        return line + (f"; dropped {', '.join(dropped)}" if dropped else "")


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return "each message must be an object with role and content"
    role = message.get("role")
    if role not in ROLES:
        return f"role {role!r} is not one of {', '.join(ROLES)}"
    content = message.get("content")
    if not isinstance(content, str):
        return f"a {role} message needs string content"
    if role == "assistant" and not content.strip() and not message.get("tool_calls"):
        return "an assistant message is empty"
    return None


def _messages(value: Any, path: str, line: int, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InputFileError(path, line, name, "expected a non-empty list of messages")
    for message in value:
        problem = _message_problem(message)
        if problem:
            raise InputFileError(path, line, name, problem)
    return value


def _scenario(item: dict[str, Any], path: str, line: int) -> str | None:
    scenario = item.get("scenario_id")
    if scenario is None:
        return None
    if isinstance(scenario, bool) or not isinstance(scenario, (str, int)):
        raise InputFileError(path, line, "scenario_id", "expected a string or an integer")
    return str(scenario)


def load_demos(path: str | os.PathLike) -> list[Demo]:
    """Read a demonstrations JSONL file (see the module docstring for the two forms).

    Raises ``InputFileError`` naming the file, line and field; a file with no
    demonstration at all is refused too."""
    path = str(path)
    demos: list[Demo] = []
    for line, item in read_jsonl_objects(path):
        scenario = _scenario(item, path, line)
        if "messages" in item:
            messages = _messages(item["messages"], path, line, "messages")
            turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            if not turns:
                raise InputFileError(path, line, "messages", "no assistant turn to learn from")
            for index in turns:
                prompt = messages[:index]
                if not any(m["role"] == "user" for m in prompt):
                    raise InputFileError(path, line, "messages",
                                         "an assistant turn comes before any user turn")
                demos.append({"prompt": prompt, "completion": [messages[index]],
                              "scenario_id": scenario})
        elif "prompt" in item and "completion" in item:
            prompt = _messages(item["prompt"], path, line, "prompt")
            completion = _messages(item["completion"], path, line, "completion")
            if not any(m["role"] == "user" for m in prompt):
                raise InputFileError(path, line, "prompt", "no user turn")
            if [m["role"] for m in completion] != ["assistant"]:
                raise InputFileError(path, line, "completion",
                                     "expected exactly one assistant message")
            demos.append({"prompt": prompt, "completion": completion, "scenario_id": scenario})
        else:
            raise InputFileError(path, line, None, 'expected {"messages": [...]} or '
                                 '{"prompt": [...], "completion": [...]}')
    if not demos:
        raise InputFileError(path, None, None, "the file holds no demonstrations")
    return demos


def reference_demos(env: Env, records: Sequence[dict[str, Any]], per_prompt: int, *,
                    seed: int = 0,
                    progress: Callable[[int, int], None] | None = None,
                    ) -> tuple[list[Demo], DemoReport]:
    """``per_prompt`` replies per record from the environment's reference agent (the
    ``reference_agent(seed)`` hook), graded by the rule: only passing replies are kept,
    identical ones once per copy of a record. A record ``--balance`` repeated (the same
    record object again, ``data.prompts.balance``) is a copy: its demonstrations count again,
    so the balance reaches the training data; distinct records of the same text are not."""
    source = require_hook(env, ReferenceAgentSource, "has no reference agent",
                          "give --demos FILE (a JSONL of conversations)")
    records = list(records)
    rows = grade(env, records, source.reference_agent(seed), k=per_prompt, seed=seed,
                 progress=progress)
    report = DemoReport(source=f"the reference agent of {env.name!r}", read=len(rows))
    copies: dict[int, int] = {}
    copy_of = []  # for each record, how many times the same object came before it
    for record in records:
        copy_of.append(copies.get(id(record), 0))
        copies[id(record)] = copy_of[-1] + 1
    demos: list[Demo] = []
    seen: set[tuple[str, str, int]] = set()
    for index, row in enumerate(rows):  # grade's rows: per_prompt per record, in order
        if not row["reward"]:
            report.failed_rule += 1
            continue
        key = (row["prompt"], row["reply"], copy_of[index // per_prompt])
        if key in seen:
            report.duplicates += 1
            continue
        seen.add(key)
        demos.append({"prompt": env.messages_for(row["prompt"]),
                      "completion": [{"role": "assistant", "content": row["reply"]}],
                      "scenario_id": row["scenario_id"]})
    return demos, report


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def drop_holdout_leaks(demos: list[Demo], holdout: Sequence[dict[str, Any]]
                       ) -> tuple[list[Demo], int]:
    """The demonstrations that touch no holdout scenario or prompt, and how many did."""
    scenarios = {str(record["scenario_id"]) for record in holdout}
    prompts = {_normal(record["prompt"]) for record in holdout}
    kept = []
    for demo in demos:
        users = {_normal(m["content"]) for m in demo["prompt"] if m["role"] == "user"}
        if demo.get("scenario_id") in scenarios or users & prompts:
            continue
        kept.append(demo)
    return kept, len(demos) - len(kept)


def distinct_prompts(demos: Sequence[Demo]) -> int:
    return len({tuple(m["content"] for m in demo["prompt"] if m["role"] == "user")
                for demo in demos})
