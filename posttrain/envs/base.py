"""The environment contract, whole: what a rule must provide and every optional hook.

An environment is a small object with tools, a system prompt, a way to read
the ground truth ("case") out of a prompt, and a reward that is a plain
function of the reply. A reply *passes* when its raw score is at least 1.0.
A second environment is one new module that defines such an object and is
registered in ``posttrain.envs`` (or named as ``module:attribute``).

``Env`` lists the required members. Each optional hook is a small protocol of its
own below (``PromptWriter``, ``ReferenceAgentSource``, ``MultiTurnEnv`` ...), with the
hook's signature and what it is for, so a type checker sees every call posttrain makes
into an environment. Generic code reaches a hook through ``require_hook`` (the hook, or
an error naming the flag that replaces it) or ``has_hook`` (a check that narrows the
type); it never guesses with ``getattr``.

A *multi-turn* environment declares it (``multi_turn = True``) and provides
``MultiTurnEnv``'s members: ``max_turns``, ``new_desk(case)`` (a fresh episode whose
``call(name, arguments) -> str`` executes one tool call and whose ``done`` says the
episode ended), ``episode_summary`` and ``trl_environment``. The episode runner
(``posttrain.score.episodes``) plays it: each policy turn with ``<tool_call>`` blocks is
executed and the results go back as tool messages; a plain turn, ``done`` or
``max_turns`` ends it. Its ``score``/``markers`` receive the policy's turns joined by
``wire.TURN_SEPARATOR`` (the row's ``reply``) and must replay them rather than trust a
result written in the text. ``check_env`` (run by ``get_env``) refuses an object that has
episode members without the declaration, or the declaration without the members.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard, TypeVar, cast, runtime_checkable

from posttrain.agents import Agent
from posttrain.errors import PosttrainError

PASS_THRESHOLD = 1.0
# a prompt longer than this is refused (a prompt file's line, an environment's
# observation): a customer message is a few hundred characters, and a 49 MB "prompt" once
# made `posttrain eval` ask for 107 GB
MAX_PROMPT_CHARS = 20_000
Case = dict[str, Any]
Messages = list[dict[str, str]]


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

    def messages_for(self, prompt: str) -> Messages:
        """Chat messages (system, user) that the policy answers."""
        ...

    def case_for(self, prompt: str) -> Case:
        """Ground truth read from the prompt text alone (never trusted from a file)."""
        ...

    def category(self, case: Case) -> str:
        """The prompt category of a case, one of ``categories``."""
        ...

    def score(self, reply: str, case: Case) -> float:
        """Raw rule score of the reply in [0, 1]; 1.0 or more is a pass."""
        ...

    def markers(self, reply: str, case: Case) -> dict[str, float]:
        """Side measurements of the reply (0/1 floats), e.g. ``well_formed``."""
        ...


#: what ``Env`` requires (the optional hooks are not here)
REQUIRED_MEMBERS = ("name", "categories", "tools", "system", "messages_for", "case_for",
                    "category", "score", "markers")


# ---------------------------------------------------------------- optional hooks


@runtime_checkable
class PromptWriter(Protocol):
    """Writes prompts: the recipes and ``posttrain prompts write`` use it when no
    ``--prompts-file`` is given."""

    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        """``count`` situations' prompt records (``prompt``, ``scenario_id``, ``category``,
        ``case``, optional ``seed``), the same for the same seed."""
        ...


@runtime_checkable
class PromptSets(Protocol):
    """Ships named prompt sets: ``--holdout-set NAME`` evaluates on one of them whole."""

    def prompt_sets(self) -> Mapping[str, str | os.PathLike[str]]:
        """Set name -> JSONL file of prompt records."""
        ...


@runtime_checkable
class ScriptedAgentSource(Protocol):
    """A no-model reference agent for ``posttrain eval --agent seeded``."""

    def scripted_agent(self, seed: int = 0,
                       behaviour: dict[str, dict[str, float]] | None = None) -> Agent:
        """The seeded scripted agent; ``behaviour`` maps a category to ``{move:
        probability}`` (None: the environment's default mix)."""
        ...


@runtime_checkable
class BehaviourHelp(Protocol):
    """Says which moves ``scripted_agent``'s ``behaviour`` may name (``--behaviour``)."""

    def behaviour_help(self) -> str:
        """One paragraph: the moves per category and the default mix."""
        ...


@runtime_checkable
class ReferenceAgentSource(Protocol):
    """The rule's right move on every prompt: ``posttrain sft --demos reference``, and the
    right moves of the environment's own starter (``posttrain.policy.starters.hook_data``)."""

    def reference_agent(self, seed: int = 0) -> Agent:
        """An agent that makes the right move (demonstrations on the train prompts)."""
        ...


@runtime_checkable
class ConstructedNegatives(Protocol):
    """Known-bad replies for DPO's ``--constructed-negatives``."""

    def constructed_negative(self, prompt: str, case: Case) -> str | None:
        """A reply the rule must fail for this prompt, or None where there is none."""
        ...


@runtime_checkable
class ScoresAhead(Protocol):
    """An environment whose score is a round trip (an OpenEnv server's episode): graders
    hand it a batch of replies first, so it can play them at once, before they read each
    score and markers one by one (``posttrain.envs.ecosystem.openenv_env``)."""

    def score_ahead(self, pairs: Sequence[tuple[str, Case]]) -> None:
        """Score these (reply, case) pairs now; ``score`` and ``markers`` then read them."""
        ...


@runtime_checkable
class DeclaresRewardedFeatures(Protocol):
    """What the reward pays for by design (``rewarded_features()`` below), for the reward
    audit and the hack monitor."""

    rewarded_features: Mapping[str, tuple[str, ...]]


@runtime_checkable
class ReadsRecordFields(Protocol):
    """Ground truth from prompt-file columns, when the text alone does not hold it."""

    #: prompt-file column -> JSON type (``"string"``, ``"number"``, ``"integer"``,
    #: ``"boolean"``, ``"object"``, ``"array"``); a file is validated against it on load
    record_fields: Mapping[str, str]

    def case_from_record(self, prompt: str, fields: dict[str, Any]) -> Case:
        """The case of a prompt from its text and its validated columns."""
        ...


@runtime_checkable
class StarterDataSource(Protocol):
    """Hand-written build data for the from-scratch starter (docs/policies.md); an
    environment without it gets its starter's data from its other hooks
    (``posttrain.policy.starters.hook_data``)."""

    def starter_data(self) -> Any:
        """System prompt, warm-start dialogues, id spellings, copy probe, default mix and
        gate ranges (the refund rule's: ``posttrain.envs.refund.starter_data``)."""
        ...


@runtime_checkable
class DefaultBaseModel(Protocol):
    """Names the starter the recipes use for this environment without ``--base-model``."""

    starter_model: str


@runtime_checkable
class Desk(Protocol):
    """One episode's tools (``MultiTurnEnv.new_desk``)."""

    #: the episode ended (a refund went through, say)
    done: bool

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Execute one tool call; its result text (an error is text too, never a raise)."""
        ...


@runtime_checkable
class MultiTurnEnv(Env, Protocol):
    """An environment that plays episodes (module docstring)."""

    #: declared, never inferred: True for an environment that plays episodes
    multi_turn: bool
    max_turns: int

    def new_desk(self, case: Case) -> Desk:
        """A fresh episode for this case."""
        ...

    def episode_summary(self, reply: str, case: Case) -> dict[str, Any]:
        """Turns, tool calls, failed calls and how the episode ended (a row's
        ``episode``)."""
        ...

    def trl_environment(self) -> type:
        """The class GRPO hands TRL as ``environment_factory`` (one per rollout)."""
        ...


@runtime_checkable
class EpisodeStarterSource(DefaultBaseModel, Protocol):
    """A multi-turn environment's own starter: a base starter continued on its episodes
    (``posttrain.policy.starters.episodes``)."""

    def starter_episode_spec(self) -> dict[str, Any]:
        """The build's fields: ``base`` (the starter it continues) and ``pass_rates``
        (``(category, low, high)`` gate ranges), plus any ``EpisodeStarterRecipe`` field."""
        ...

    def starter_dialogue(self, prompt: str, right: bool, rng: Any) -> tuple[str, str, list]:
        """One warm-start episode: ``(prompt, move, turns)``; ``right`` asks for the right
        move, else the behaviour mix."""
        ...


#: each hook protocol and the member a missing-hook error names
HOOK_NAMES: dict[type, str] = {
    PromptWriter: "write_prompts",
    PromptSets: "prompt_sets",
    ScriptedAgentSource: "scripted_agent",
    BehaviourHelp: "behaviour_help",
    ReferenceAgentSource: "reference_agent",
    ConstructedNegatives: "constructed_negative",
    ScoresAhead: "score_ahead",
    DeclaresRewardedFeatures: "rewarded_features",
    ReadsRecordFields: "case_from_record",
    StarterDataSource: "starter_data",
    DefaultBaseModel: "starter_model",
    EpisodeStarterSource: "starter_episode_spec",
    MultiTurnEnv: "new_desk",
}

HookT = TypeVar("HookT")


def env_label(env: object) -> str:
    """The environment's name for messages (its ``repr`` when it has none)."""
    return repr(getattr(env, "name", env))


def env_name(env: object) -> str | None:
    """The environment's ``name`` (optional on an environment), or None."""
    name = getattr(env, "name", None)
    return name if isinstance(name, str) and name else None


def has_hook(env: object, hook: type[HookT]) -> TypeGuard[HookT]:
    """Does ``env`` provide the optional hook ``hook`` (one of the protocols above)? A
    member that is there but not callable where a method is due does not count."""
    if hook is MultiTurnEnv:
        return is_multi_turn(env)
    if not isinstance(env, hook):
        return False
    member = getattr(env, HOOK_NAMES[hook])
    return callable(member) or hook in (DeclaresRewardedFeatures, DefaultBaseModel)


def require_hook(env: object, hook: type[HookT], lacks: str, instead: str) -> HookT:
    """``env`` typed as providing ``hook``, or a ``PosttrainError`` such as
    "environment 'shout' writes no prompts (no write_prompts hook): give --prompts-file"
    (``lacks`` = "writes no prompts", ``instead`` = "give --prompts-file")."""
    if not has_hook(env, hook):
        raise PosttrainError(
            f"environment {env_label(env)} {lacks} (no {HOOK_NAMES[hook]} hook): {instead}")
    return cast(HookT, env)  # has_hook checked the protocol at run time


def is_multi_turn(env: object) -> TypeGuard[MultiTurnEnv]:
    """Does the environment declare that it plays episodes (``multi_turn = True``)?"""
    return getattr(env, "multi_turn", False) is True


def as_multi_turn(env: Env) -> MultiTurnEnv:
    """``env`` typed as a multi-turn environment; PosttrainError when it is not one."""
    return require_hook(env, MultiTurnEnv, "plays no episodes",
                        "declare multi_turn = True with max_turns and new_desk")


def check_env(env: object, where: str) -> Env:
    """``env`` as an ``Env``, or a PosttrainError naming what it lacks (``where``: how the
    user named it, e.g. ``--env 'my_rules.py:ENV'``). A multi-turn environment must
    declare itself and have every episode member; episode members without the
    declaration are refused too, since they would silently be played as single replies."""
    if not isinstance(env, Env):
        missing = [member for member in REQUIRED_MEMBERS if not hasattr(env, member)]
        raise PosttrainError(
            f"{where} is not an environment: it lacks {', '.join(missing) or '?'} "
            "(see docs/environments.md, 'Write your own rule')"
        )
    episode_members = ("max_turns", "new_desk", "episode_summary", "trl_environment")
    present = [member for member in episode_members if hasattr(env, member)]
    if is_multi_turn(env):
        missing = [member for member in episode_members if member not in present]
        if missing or not isinstance(env.max_turns, int):
            raise PosttrainError(
                f"{where} declares multi_turn = True but lacks "
                f"{', '.join(missing) or 'an integer max_turns'} (docs/environments.md, "
                "'multi-turn')")
    elif "new_desk" in present:
        raise PosttrainError(
            f"{where} has new_desk but does not declare multi_turn = True: declare it to "
            "play episodes (docs/environments.md, 'multi-turn')")
    return env


def own_starter_model(env: Env) -> str | None:
    """The starter the environment names for the recipes (its ``starter_model``), or None
    when it names none (the recipes then use the embedded ``starter``)."""
    return env.starter_model if has_hook(env, DefaultBaseModel) and env.starter_model else None


def check_default_base_model(env: Env) -> None:
    """Refuse to train ``env`` on the embedded starter when the environment says no starter
    can play it (its ``needs_base_model``: why), naming the flag to give instead."""
    why = getattr(env, "needs_base_model", None)
    if isinstance(why, str) and why and own_starter_model(env) is None:
        raise PosttrainError(
            f"environment {env_label(env)}: {why}; bring a base model with --base-model "
            "(e.g. --base-model smollm2, or a Hugging Face model folder)")


def require_single_turn(env: Env, what: str) -> None:
    """Stop ``what`` (a command that trains or scores single replies) on a multi-turn
    environment, saying what to use instead."""
    if is_multi_turn(env):
        raise PosttrainError(
            f"{what} works on single replies and environment {env_label(env)} "
            "plays multi-turn episodes: train it with `posttrain grpo`, measure it with "
            "`posttrain eval`")


#: JSON types a ``record_fields`` entry may name, and the Python values that match each
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


def record_fields(env: object) -> dict[str, str]:
    """The prompt-file columns the environment reads (``ReadsRecordFields``), or {}."""
    if has_hook(env, ReadsRecordFields):
        return dict(env.record_fields or {})
    return {}


def reads_records(env: object) -> bool:
    """Does the environment build its cases from prompt-file columns?"""
    return bool(record_fields(env))


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
    if has_hook(env, ReadsRecordFields) and reads_records(env):
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
    declared = (env.rewarded_features or {}) if has_hook(env, DeclaresRewardedFeatures) else {}
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
