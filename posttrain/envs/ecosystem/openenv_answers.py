"""What an OpenEnv server answered, read in one place and checked against the shape
posttrain expects, before anything else reads it.

``read_schema`` does the same for ``/schema`` (its action and observation JSON schemas).
OpenEnv's client hands over whatever JSON the server sent: an observation may be a
string or a number, its metadata a list, ``done`` the string ``"false"`` (truthy), a
reward a 4,000-digit integer or ``1.7e308`` (finite, but its square is not: the training
maths end in a traceback far from the cause). ``read_answer`` turns a reset's or a step's
result into an ``Answer`` whose fields have their types, or raises one ``PosttrainError``
line naming the server, the call and the field (the command exits 2). The prompt shown
from an observation is held to the prompt limit posttrain's prompt files have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import MAX_PROMPT_CHARS
from posttrain.errors import PosttrainError
from posttrain.text import json_kind

#: the largest reward magnitude taken: its square and a group's sum stay finite in float64
#: and far from float32's range after normalisation (a reward beyond it is a bug or an
#: attack, not a score)
MAX_REWARD = 1e12


@dataclass(frozen=True)
class Answer:
    """A reset's or a step's result, its fields of the types posttrain reads."""

    observation: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    done: bool = False


def read_answer(result: Any, where: str, what: str) -> Answer:
    """``result`` (OpenEnv's ``StepResult``) checked (module docstring); ``where``: the
    environment, ``what``: the call (``reset(seed=3)``)."""
    def refuse(name: str, expected: str, value: Any) -> PosttrainError:
        return PosttrainError(f"{where}: {what} answered {name} as {json_kind(value)}; expected "
                              f"{expected}")

    observation = getattr(result, "observation", None)
    if observation is None:
        observation = {}
    if not isinstance(observation, dict):
        raise refuse("its observation", "a JSON object", observation)
    metadata: dict[str, Any] = {}
    for name, value in (("the observation's metadata", observation.get("metadata")),
                        ("its metadata", getattr(result, "metadata", None))):
        if value is None:
            continue
        if not isinstance(value, dict):
            raise refuse(name, "a JSON object", value)
        metadata.update(value)
    done = getattr(result, "done", False)
    if done is None:
        done = False
    if not isinstance(done, bool):
        raise refuse("done", "true or false", done)
    return Answer(observation, metadata, read_reward(getattr(result, "reward", None),
                                                     where, what), done)


def read_schema(schema: Any, where: str) -> dict[str, Any]:
    """``/schema``'s answer, its parts posttrain reads of the types a JSON schema gives
    them: the action (and the observation, when there is one) an object whose
    ``properties`` map names to objects, each ``type`` a string and each ``anyOf`` a list
    of objects, ``required`` a list of names. ``PosttrainError`` naming the part."""
    def refuse(part: str, expected: str, value: Any) -> PosttrainError:
        return PosttrainError(f"{where}: its /schema's {part} is {json_kind(value)}; "
                              f"expected {expected} (is it an OpenEnv server?)")

    if not isinstance(schema, dict):
        raise refuse("answer", "a JSON object", schema)
    for part in ("action", "observation"):
        value = schema.get(part)
        if value is None and part == "observation":
            continue
        if not isinstance(value, dict):
            raise refuse(part, "a JSON object (a JSON schema)", value)
        properties = value.get("properties") or {}
        if not isinstance(properties, dict):
            raise refuse(f"{part} properties", "an object of fields", properties)
        for name, spec in properties.items():
            if not isinstance(spec, dict):
                raise refuse(f"{part} field {name[:40]!r}", "an object", spec)
            options = spec.get("anyOf") or [spec]
            if not isinstance(options, list) or not all(
                    isinstance(option, dict) and isinstance(option.get("type", ""), str)
                    for option in options):
                raise refuse(f"{part} field {name[:40]!r}'s types",
                             "a type name or a list of them", spec.get("anyOf", spec))
        required = value.get("required") or []
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise refuse(f"{part} required fields", "a list of names", required)
    return schema


def read_reward(value: Any, where: str, what: str) -> float | None:
    """A reward: None (none given), or a finite number of at most ``MAX_REWARD`` in size."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PosttrainError(f"{where}: {what} answered a reward that is {json_kind(value)}; "
                             "a reward must be a finite number")
    if isinstance(value, int) and abs(value) > MAX_REWARD:  # before float(): no overflow
        reward = math.inf
    else:
        reward = float(value)
    if not math.isfinite(reward) or abs(reward) > MAX_REWARD:
        shown = (f"{value:.3g}" if isinstance(value, float)
                 else f"of about {int(value.bit_length() * 0.30103)} digits")
        raise PosttrainError(f"{where}: {what} answered a reward {shown}; a reward must be a "
                             f"finite number of at most {MAX_REWARD:g} in size")
    return reward


def held_prompt(text: str, where: str, what: str) -> str:
    """A prompt shown from an observation, refused past the prompt limit (a 50 MB
    observation became a prompt no file could read back)."""
    if len(text) > MAX_PROMPT_CHARS:
        raise PosttrainError(f"{where}: {what} answered an observation of {len(text):,} "
                             f"characters as the prompt; prompts are at most "
                             f"{MAX_PROMPT_CHARS:,} (give --env-arg prompt_field=FIELD to show "
                             "one field)")
    return text
