"""``--env verifiers:ENV_ID``, ``--env inspect:PKG/TASK`` and ``--env openenv:URL|MODULE:APP``:
the spec of an ecosystem environment.

A spec is one string, so it travels wherever ``--env`` does (a run's config, ``--from-run``,
the dashboard) and names the same environment again: ``LIBRARY:TARGET``, then the
loader's keyword arguments as a query string, ``verifiers:vf-arith?count=40&ops=%5B%22+%22%5D``.
``--env-arg KEY=VALUE`` (repeatable) writes that query for you. A value is read as JSON
when it parses (``count=40`` is the number 40, ``strict=true`` a boolean,
``ops=["+"]`` a list) and as text otherwise (``split=test``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from posttrain.errors import PosttrainError

#: the libraries ``--env LIBRARY:...`` loads through
LIBRARIES = ("verifiers", "inspect", "openenv")
#: query keys that are posttrain's own, not the loader's (``--env-judge-endpoint`` and its
#: companions): the judge model an environment's own judge calls
JUDGE_KEYS = {"posttrain.judge_endpoint": "url", "posttrain.judge_model": "model",
              "posttrain.judge_key_env": "key_env"}


@dataclass(frozen=True)
class JudgeEndpoint:
    """The OpenAI-compatible API an environment's own judge (a verifiers ``JudgeRubric``,
    a v1 judge) calls instead of the one it names: ``--env-judge-endpoint``."""

    url: str
    model: str | None = None
    key_env: str = "OPENAI_API_KEY"


@dataclass
class EcosystemSpec:
    """A parsed ``LIBRARY:TARGET?KEY=VALUE...``."""

    library: str
    target: str
    args: dict[str, Any] = field(default_factory=dict)

    def loader_args(self) -> dict[str, Any]:
        """The arguments for the library's loader (posttrain's own keys left out)."""
        return {key: value for key, value in self.args.items() if key not in JUDGE_KEYS}

    def judge(self) -> JudgeEndpoint | None:
        """The judge endpoint the spec names (``--env-judge-endpoint``), or None."""
        given = {JUDGE_KEYS[key]: str(value) for key, value in self.args.items()
                 if key in JUDGE_KEYS}
        if not given:
            return None
        if "url" not in given:
            raise PosttrainError("--env-judge-model and --env-judge-key-env need "
                                 "--env-judge-endpoint URL")
        return JudgeEndpoint(**given)


def parse_env_spec(name: str) -> EcosystemSpec | None:
    """The ecosystem spec ``name`` spells, or None when it names no ecosystem library."""
    library, colon, rest = name.partition(":")
    if not colon or library not in LIBRARIES:
        return None
    target, _, query = rest.partition("?")
    if not target:
        raise PosttrainError(f"--env {name!r}: name the {library} environment after "
                             f"'{library}:', e.g. {library}:{_EXAMPLES[library]}")
    args: dict[str, Any] = {}
    for key, text in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        args[key] = _value(text)
    return EcosystemSpec(library, target, args)


def with_env_args(env: str, pairs: list[str] | None) -> str:
    """``env`` with ``--env-arg KEY=VALUE`` pairs added to its query (later ones win)."""
    if not pairs:
        return env
    spec = parse_env_spec(env)
    if spec is None:
        raise PosttrainError(
            f"--env-arg applies to an environment loaded by a library (--env "
            f"verifiers:ENV_ID, inspect:PKG/TASK or openenv:URL); --env {env!r} takes no "
            "arguments")
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise PosttrainError(f"--env-arg {pair!r}: expected KEY=VALUE, e.g. count=40")
        spec.args[key.strip()] = _value(value)
    return spec_text(spec)


def spec_text(spec: EcosystemSpec) -> str:
    """The one-string form of ``spec`` (values that are not text written as JSON)."""
    text = f"{spec.library}:{spec.target}"
    if spec.args:
        text += "?" + urlencode({key: _written(value) for key, value in spec.args.items()})
    return text


def _written(value: Any) -> str:
    # text stays bare unless it would read back as something else ("40", "true")
    if isinstance(value, str) and _value(value) == value:
        return value
    return json.dumps(value)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


_EXAMPLES = {"verifiers": "vf-arith", "inspect": "inspect_arith/arith",
             "openenv": "http://127.0.0.1:8000"}
