"""The environment contract: what a rule needs to be trained against.

An environment is a small object with tools, a system prompt, a way to read
the ground truth ("case") out of a prompt, and a reward that is a plain
function of the reply. A reply *passes* when its raw score is at least 1.0.
A second environment is one new module that defines such an object and is
registered in ``posttrain.envs`` (or named as ``module:attribute``).

Optional hooks, each used by the commands that need it (``env_hook`` stops a
command that needs a missing one with an error naming the flag that replaces it):

- ``write_prompts(count, seed) -> list[dict]``: a prompt writer (records with
  ``prompt``, ``scenario_id``, ``category``, ``case``); the recipes and ``posttrain
  prompts write`` use it when no ``--prompts-file`` is given;
- ``prompt_sets() -> dict[str, path]``: prompt sets the environment ships, by name;
  ``--holdout-set NAME`` evaluates on one of them whole (``posttrain.data.prepare``);
- ``scripted_agent(seed, behaviour) -> agent``: a scripted reference agent (no
  model) for ``posttrain eval --agent seeded``; ``behaviour`` maps a category to
  ``{move: probability}``; ``behaviour_help() -> str`` says which moves exist;
- ``reference_agent(seed) -> agent``: an agent that makes the rule's right move, for
  ``posttrain sft --demos reference`` (demonstrations on the train prompts);
- ``constructed_negative(prompt, case) -> str | None``: a known-bad reply for a
  prompt, for DPO's ``--constructed-negatives``;
- ``rewarded_features``: what the reward pays for by design (``rewarded_features``
  below), for the reward audit and the hack monitor;
- ``record_fields`` and ``case_from_record(prompt, fields) -> case``: ground truth
  from the data, when the text alone does not hold it (an expected answer, say).
  ``record_fields`` maps a prompt-file column to its JSON type (``"string"``,
  ``"number"``, ``"integer"``, ``"boolean"``, ``"object"``, ``"array"``); a prompt
  file is validated against it on load, line by line, and the case is built from the
  prompt and those columns (``case_of`` below) everywhere a reply is scored.

``categories`` (required) names the prompt categories in display order.

A *multi-turn* environment (``is_multi_turn``) adds ``max_turns`` and
``new_desk(case)``: a fresh episode whose ``call(name, arguments) -> str`` executes
one tool call and returns its result text, and whose ``done`` says the episode
ended (a refund went through, say). The episode runner (``posttrain.score.episodes``)
plays it: each policy turn with ``<tool_call>`` blocks is executed and the results
go back as tool messages; a plain turn, ``done`` or ``max_turns`` ends it. Its
``score``/``markers`` receive the policy's turns joined by ``wire.TURN_SEPARATOR``
(the row's ``reply``) and must replay them rather than trust a result written in
the text. ``episode_summary(reply, case)`` gives the row's turn and tool counts, and
``trl_environment()`` the class GRPO hands TRL as ``environment_factory``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from posttrain.errors import PosttrainError

PASS_THRESHOLD = 1.0


@runtime_checkable
class Env(Protocol):
    """What every environment provides. See ``posttrain.envs.refund`` for one."""

    name: str
    #: the categories ``category()`` can return, in display order
    categories: tuple[str, ...]
    #: OpenAI function-tool schemas the policy may call
    tools: list[dict[str, Any]]
    #: the full system prompt: policy text, tool list and wire-format instruction
    system: str

    def messages_for(self, prompt: str) -> list[dict[str, str]]:
        """Chat messages (system, user) that the policy answers."""
        ...

    def case_for(self, prompt: str) -> dict[str, Any]:
        """Ground truth read from the prompt text alone (never trusted from a file)."""
        ...

    def category(self, case: dict[str, Any]) -> str:
        """The prompt category of a case, one of ``categories``."""
        ...

    def score(self, reply: str, case: dict[str, Any]) -> float:
        """Raw rule score of the reply in [0, 1]; 1.0 or more is a pass."""
        ...

    def markers(self, reply: str, case: dict[str, Any]) -> dict[str, float]:
        """Side measurements of the reply (0/1 floats), e.g. ``well_formed``."""
        ...


#: what ``Env`` requires (the optional hooks are not here)
REQUIRED_MEMBERS = ("name", "categories", "tools", "system", "messages_for", "case_for",
                    "category", "score", "markers")


def env_hook(env: Env, name: str, lacks: str, instead: str) -> Callable[..., Any]:
    """The environment's optional hook ``name``, or a ``PosttrainError`` such as
    "environment 'shout' writes no prompts (no write_prompts hook): give --prompts-file"
    (``lacks`` = "writes no prompts", ``instead`` = "give --prompts-file")."""
    hook = getattr(env, name, None)
    if not callable(hook):
        raise PosttrainError(
            f"environment {getattr(env, 'name', env)!r} {lacks} (no {name} hook): {instead}"
        )
    return hook


def is_multi_turn(env: Env) -> bool:
    """Does the environment play episodes (``max_turns`` and ``new_desk``)?"""
    return callable(getattr(env, "new_desk", None)) and isinstance(
        getattr(env, "max_turns", None), int)


def require_single_turn(env: Env, what: str) -> None:
    """Stop ``what`` (a command that trains or scores single replies) on a multi-turn
    environment, saying what to use instead."""
    if is_multi_turn(env):
        raise PosttrainError(
            f"{what} works on single replies and environment {getattr(env, 'name', env)!r} "
            "plays multi-turn episodes: train it with `posttrain grpo`, measure it with "
            "`posttrain eval`")


#: JSON types a ``record_fields`` entry may name, and the Python values that match each
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


def reads_records(env: Env) -> bool:
    """Does the environment build its cases from prompt-file columns?"""
    return bool(getattr(env, "record_fields", None)) and callable(
        getattr(env, "case_from_record", None))


def field_problem(kind: str, value: Any) -> str | None:
    """What is wrong with ``value`` as a ``record_fields`` column of JSON type ``kind``."""
    types = FIELD_TYPES.get(kind)
    if types is None:
        return f"the environment declares an unknown type {kind!r}"
    if isinstance(value, bool) and bool not in types:
        return f"expected {kind}, got a boolean"
    if not isinstance(value, types):
        return f"expected {kind}, got {type(value).__name__}"
    return None


def case_of(env: Env, record: Mapping[str, Any]) -> dict[str, Any]:
    """The case of a prompt record or graded row: from its columns when the environment
    reads them (``record["fields"]``, validated on load), else from the prompt text."""
    if reads_records(env):
        if "case" in record:
            return dict(record["case"])
        return env.case_from_record(record["prompt"], dict(record.get("fields") or {}))
    return env.case_for(record["prompt"])


#: the key of ``rewarded_features`` that applies to every category
ALL_CATEGORIES = "*"


def rewarded_features(env: Env, category: str | None = None) -> tuple[str, ...]:
    """Reply features the environment's reward pays for *by design*, for one category.

    An environment may declare ``rewarded_features``: a mapping from category (or
    ``"*"`` for all) to ``hack_scan`` feature names (``tool:<name>``, ``has_question``,
    ``length``, ``marker:<m>``, ``word:<w>`` ...), each with the direction the design
    pays in: a bare name means the reward pays for *more* of it, ``-name`` for *less*
    (``-length``: shorter replies), ``~name`` either way (a lesser mistake the rule
    prices, whose net direction depends on what else the policy does). The reward audit
    and the hack monitor treat those as intended; anything else the reward turns out to
    pay for, or a declared feature paid for in the other direction, is reported.
    ``category=None`` gives every declared feature. An environment without the
    attribute declares nothing.
    """
    declared = getattr(env, "rewarded_features", None) or {}
    if category is None:
        return tuple(dict.fromkeys(name for names in declared.values() for name in names))
    return tuple(dict.fromkeys([*declared.get(ALL_CATEGORIES, ()), *declared.get(category, ())]))


DESIGN_SIGNS = ("-", "~")  # prefixes of a declared feature: pays for less / either way


def feature_name(declared: str) -> str:
    """The hack_scan feature name of a declared feature (its direction prefix removed)."""
    return declared[1:] if declared[:1] in DESIGN_SIGNS else declared


def design_direction(declared: Iterable[str], name: str) -> str | None:
    """``"+"``, ``"-"`` or ``"~"``: the direction the design pays ``name`` in; None if
    the design does not name it. A bare name (``lookup_order``) matches its feature
    (``tool:lookup_order``), as in ``hack_scan``."""
    lowered = name.lower()
    bare = lowered.split(":", 1)[1] if ":" in lowered else lowered
    for entry in declared:
        if feature_name(entry).lower() in (lowered, bare):
            return entry[0] if entry[:1] in DESIGN_SIGNS else "+"
    return None


def passes(score: float) -> bool:
    """True when a raw score counts as a pass (at least 1.0)."""
    return score >= PASS_THRESHOLD
