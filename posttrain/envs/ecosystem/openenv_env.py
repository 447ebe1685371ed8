"""An OpenEnv environment as a posttrain environment: ``--env openenv:http://HOST:PORT`` or
``--env openenv:MODULE:APP``.

OpenEnv (the ``openenv`` package) serves an environment (``reset()``, ``step(action)``,
``state``; typed Action and Observation models, the observation carrying ``reward`` and
``done``) over HTTP and a WebSocket; its HTTP ``/reset`` and ``/step`` keep no state (each
builds a fresh environment), so posttrain plays every episode over the WebSocket
(``openenv``'s own ``GenericEnvClient``: one environment on the server for the session).
The adapter maps it onto posttrain's contract:

- **prompts**: the first observation of ``reset(seed=i)`` for ``i`` in ``0 ..
  prompts-1`` (``--env-arg prompts=N``, default 100; ``first_seed``); the prompt is the
  observation's text field (``prompt_field``, else the one text field, else a field named
  ``prompt``, else the observation as JSON); its scenario is the seed; its category the
  observation's ``metadata["category"]`` when it has one, else ``default``. Each record
  carries its seed (a ``seed`` column), since the text alone need not name the episode.
  An observation that carries the chat (``messages``, ending with the prompt as the
  user's) gives the messages before the prompt, such as a system prompt (the same for
  every prompt, as posttrain's prompts share one);
- **the reply** becomes the Action: with one text field (``/schema``'s action, its
  ``metadata`` aside; or ``action_field``) the reply is that field; otherwise the reply is
  read as a JSON object of the Action's fields. A reply that does not make an Action
  (not JSON, a missing or unknown field, a wrong type, or the server's own validation
  refusing it) is a scored failure (0.0, marker ``action_ok`` 0), never a crash;
- **the reward** is the observation's ``reward`` after the step (a pass at 1.0 or more, as
  for every posttrain rule); an episode must be done after the policy's reply (a
  single-step environment; ``--env-arg max_turns=N`` plays episodes of several steps,
  ``openenv_steps``): one that is not is refused in one line, as is a reward that is
  missing or not a finite number;
- markers: ``action_ok`` (the reply made an Action).

Errors are one line naming the environment and the problem: a server that is down, slow
(``timeout_s``, default 30), answers something that is not JSON, a reward that is None or
NaN, an episode that never ends. ``--env-arg`` keys: ``prompts``, ``first_seed``,
``prompt_field``, ``action_field``, ``timeout_s``, ``max_turns``, ``reward`` (last|sum),
``concurrency`` (default 4).

Episodes run on up to ``concurrency`` WebSocket sessions at once (``openenv_sessions``:
one environment on the server each, fewer when the server says it is at capacity): the
first observations, and each batch the graders hand over before reading it
(``score_ahead``, the ``ScoresAhead`` hook). A reply's episode is played once; its score
and markers read the same result.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.envs.base import Case
from posttrain.envs.ecosystem.dataset_adapter import (
    DEFAULT_CATEGORY,
    DatasetAdapter,
    Sample,
    ScoreCache,
    shared_prefix,
)
from posttrain.envs.ecosystem.openenv_answers import (
    Answer,
    held_prompt,
    read_answer,
    read_schema,
)
from posttrain.envs.ecosystem.openenv_server import (
    LocalServer,
    get_json,
    local_server,
    token_headers,
)
from posttrain.envs.ecosystem.openenv_sessions import SessionPool
from posttrain.errors import PosttrainError
from posttrain.interrupts import raise_if_interrupted

DEFAULT_PROMPTS = 100
DEFAULT_TIMEOUT_S = 30.0
#: the OpenEnv Observation's own fields, never the prompt
OBSERVATION_BASE_FIELDS = frozenset({"done", "reward", "metadata"})
#: --env-arg keys this adapter reads
ARG_KEYS = ("prompts", "first_seed", "prompt_field", "action_field", "timeout_s",
            "max_turns", "reward", "concurrency")
#: episodes played at once (one server session each), unless the server allows fewer
DEFAULT_CONCURRENCY = 4
#: JSON schema types and the Python values an Action field of that type takes
_SCHEMA_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),)}


def import_openenv() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise PosttrainError(
            "--env openenv:...: the openenv package is not installed; install posttrain's "
            "openenv extra (pip install 'posttrain[openenv]', Python 3.10+)") from None
    return GenericEnvClient


def session_opener(url: str, timeout_s: float) -> Callable[[], Any]:
    """What opens one WebSocket session (one environment on the server) at ``url``."""

    def open_session() -> Any:
        client_class = import_openenv()
        return client_class(base_url=url, connect_timeout_s=timeout_s,
                            message_timeout_s=timeout_s, headers=token_headers()).sync()

    return open_session


def release(sessions: SessionPool, server: LocalServer | None) -> None:
    """End an adapter's sessions and stop the app it started (when it or the run ends)."""
    sessions.close()
    if server is not None:
        server.stop()


def _field_types(schema: dict[str, Any]) -> dict[str, set[str]]:
    """Each property of a pydantic JSON schema and the JSON types it accepts."""
    types: dict[str, set[str]] = {}
    for name, spec in (schema.get("properties") or {}).items():
        options = spec.get("anyOf") or [spec]
        types[name] = {option.get("type") for option in options if option.get("type")}
    return types


def _chat(value: Any) -> list[dict[str, str]] | None:
    """An observation's ``messages`` as chat messages, or None when it is not a chat."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str)
               and isinstance(m.get("content"), str) for m in value):
        return None
    return [{"role": m["role"], "content": m["content"]} for m in value]


class ActionShape:
    """What an Action looks like (from ``/schema``) and how a reply becomes one."""

    def __init__(self, schema: dict[str, Any], field: str | None, where: str) -> None:
        types = _field_types(schema)
        types.pop("metadata", None)
        self.fields = types
        self.required = [name for name in schema.get("required") or [] if name != "metadata"]
        if field is not None and field not in types:
            raise PosttrainError(f"{where}: action_field {field!r} is not a field of its "
                                 f"Action (it has {', '.join(sorted(types)) or 'none'})")
        text_fields = [name for name, kinds in types.items() if "string" in kinds]
        if field is None and len(types) == 1 and text_fields:
            field = text_fields[0]
        self.text_field = field

    def describe(self) -> str:
        if self.text_field:
            return f"the reply is the Action's {self.text_field!r}"
        return f"the reply is a JSON object of the Action's fields ({', '.join(self.fields)})"

    def action_for(self, reply: str) -> dict[str, Any] | None:
        """The Action the reply makes, or None when it makes none."""
        if self.text_field is not None:
            return {self.text_field: reply}
        text = reply.strip()
        if text.startswith("```"):  # a fenced JSON block
            text = text.strip("`").removeprefix("json").strip()
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return self.checked(value)

    def checked(self, value: Any) -> dict[str, Any] | None:
        """``value`` when it is an Action's fields (names, required ones, JSON types)."""
        if not isinstance(value, dict) or any(name not in self.fields for name in value):
            return None
        if any(name not in value for name in self.required):
            return None
        for name, item in value.items():
            allowed = tuple(kind for type_name in self.fields[name]
                            for kind in _SCHEMA_TYPES.get(type_name, ()))
            if allowed and (not isinstance(item, allowed) or (
                    isinstance(item, bool) and bool not in allowed)):
                return None
        return value

    def system_prompt(self) -> str:
        if self.text_field:
            return ""
        listed = ", ".join(f"{name} ({'/'.join(sorted(kinds)) or 'any'})"
                           for name, kinds in self.fields.items())
        return f"Reply with one JSON object with these fields: {listed}."


class OpenEnvEnv(DatasetAdapter):
    """An OpenEnv environment behind posttrain's ``Env`` contract (module docstring)."""

    #: the embedded starter knows refund dialogues, and an OpenEnv server offers no
    #: reference policy to build one from: the recipes ask for a base model
    needs_base_model = ("an OpenEnv server offers no reference policy to build a starter "
                        "from, and the embedded starter knows only the refund rule")

    def __init__(self, target: str, args: dict[str, Any] | None = None) -> None:
        self.tools: list[dict[str, Any]] = []  # an Action is the reply, not a tool call
        self.target = target
        self.args = dict(args or {})
        unknown = sorted(set(self.args) - set(ARG_KEYS))
        if unknown:
            raise PosttrainError(f"--env openenv:{target}: unknown --env-arg "
                                 f"{', '.join(unknown)} (known: {', '.join(ARG_KEYS)})")
        self.name = f"openenv:{target}"
        self.where = f"OpenEnv environment {self.name!r}"
        self.timeout_s = self._number("timeout_s", DEFAULT_TIMEOUT_S, low=0.1)
        count = int(self._number("prompts", DEFAULT_PROMPTS, low=1, whole=True))
        self.max_turns = int(self._number("max_turns", 1, low=1, whole=True))
        self.reward_of = str(self.args.get("reward", "last"))
        if self.reward_of not in ("last", "sum"):
            raise PosttrainError(f"--env-arg reward={self.reward_of!r}: expected last (the "
                                 "episode's last reward) or sum (all its rewards)")
        first = int(self._number("first_seed", 0, low=0, whole=True))
        self.server: LocalServer | None = None
        if target.startswith(("http://", "https://")):
            self.url = target.rstrip("/")
        else:
            self.server = local_server(target)
            self.url = self.server.url
        schema = read_schema(get_json(f"{self.url}/schema", self.timeout_s, self.where,
                                      headers=token_headers()), self.where)
        self.action = ActionShape(schema["action"], self.args.get("action_field"), self.where)
        self.prompt_field = self._prompt_field(schema.get("observation") or {})
        self.system = self.action.system_prompt()
        concurrency = int(self._number("concurrency", DEFAULT_CONCURRENCY, low=1, whole=True))
        self.sessions = SessionPool(session_opener(self.url, self.timeout_s), concurrency,
                                    self.where)
        # dropped (a command in a notebook or a test returns), it ends its sessions and
        # stops its app, so a shared server's slots come back without waiting for exit
        self._release = weakref.finalize(self, release, self.sessions, self.server)
        self._graded_replies = ScoreCache()
        self.record_fields = {"seed": "integer", "category": "string"}
        self._prefixes: list[list[dict[str, str]]] = []
        samples = self._at_once(self._first_observation, range(first, first + count))
        # the messages before the prompt, when the observation carries the chat (as
        # `posttrain env serve` does: the rule's system prompt), else the Action's format
        self._prefix = shared_prefix(self._prefixes, self.where) if self._prefixes else (
            [{"role": "system", "content": self.system}] if self.system else [])
        system = [m["content"] for m in self._prefix if m["role"] == "system"]
        self.system = system[0] if system else self.system
        self._keep_samples(samples)
        self.categories = tuple(sorted({sample.fields["category"] for sample in samples}))

    # -- arguments and schema ---------------------------------------------------

    def _number(self, key: str, default: float, *, low: float, whole: bool = False) -> float:
        value = self.args.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value) or value < low or (whole and value != int(value)):
            kind = "a whole number" if whole else "a number"
            raise PosttrainError(f"--env-arg {key}={value!r}: expected {kind} of at least "
                                 f"{low:g}")
        return float(value)

    def _prompt_field(self, schema: dict[str, Any]) -> str | None:
        asked = self.args.get("prompt_field")
        types = {name: kinds for name, kinds in _field_types(schema).items()
                 if name not in OBSERVATION_BASE_FIELDS}
        if asked is not None:
            if asked not in types:
                raise PosttrainError(f"{self.where}: prompt_field {asked!r} is not a field of "
                                     f"its Observation (it has {', '.join(sorted(types))})")
            return str(asked)
        text = [name for name, kinds in types.items() if "string" in kinds]
        if len(text) == 1:
            return text[0]
        return "prompt" if "prompt" in text else None

    # -- the sessions ---------------------------------------------------------------

    def _at_once(self, work: Any, items: Any) -> list[Any]:
        """``work`` over ``items`` on up to ``concurrency`` sessions at once, in order."""
        items = list(items)
        if self.sessions.limit <= 1 or len(items) <= 1:
            return [work(item) for item in items]
        pool = ThreadPoolExecutor(min(self.sessions.limit, len(items)),
                                  thread_name_prefix="openenv episode")
        try:
            done = []
            for result in pool.map(work, items):
                raise_if_interrupted()  # a Ctrl-C Python dropped stops here, not at the end
                done.append(result)
        except KeyboardInterrupt:
            # Ctrl-C: the episodes in flight are not waited for (a step a server never
            # answers would hold the command until its timeout); the command is ending,
            # and its exit gives what is left a deadline (posttrain.cli.exit_by_deadline)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        except BaseException:
            # a failed episode: wait only for the episodes in flight
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            # one session stays for the episodes that come one at a time
            self.sessions.close(keep=1)
            self.sessions.say_limit()
        pool.shutdown(wait=True)
        return done

    def close(self) -> None:
        """End the sessions and stop a server this adapter started."""
        self._release()

    def _first_observation(self, seed: int) -> Sample:
        what = f"reset(seed={seed})"
        answer = self.sessions.run(what, lambda env: read_answer(env.reset(seed=seed),
                                                                 self.where, what))
        observation = answer.observation
        category = answer.metadata.get("category")
        prompt = held_prompt(self._prompt_text(observation), self.where, what)
        chat = _chat(observation.get("messages"))
        if chat and chat[-1] == {"role": "user", "content": prompt}:
            self._prefixes.append(chat[:-1])
        return Sample(prompt, f"seed-{seed}", {
            "seed": seed,
            "category": str(category) if isinstance(category, str) and category
            else DEFAULT_CATEGORY})

    def _prompt_text(self, observation: dict[str, Any]) -> str:
        if self.prompt_field is not None:
            value = observation.get(self.prompt_field)
            return value if isinstance(value, str) else json.dumps(value)
        shown = {key: value for key, value in observation.items()
                 if key not in OBSERVATION_BASE_FIELDS}
        return json.dumps(shown, sort_keys=True)

    # -- posttrain's contract -------------------------------------------------------

    def _unknown_prompt(self) -> str:
        return (f"{self.where}: the prompt is not one of the first observations posttrain "
                "read, so its episode is unknown: give its seed in a 'seed' column")

    def category(self, case: Case) -> str:
        return str(case.get("category") or DEFAULT_CATEGORY)

    def replay(self, seed: int, actions: list[dict[str, Any]]) -> list[Answer]:
        """``reset(seed)`` then one step per action, on the session: the step results,
        each checked (``openenv_answers.read_answer``)."""

        def play(env: Any) -> list[Answer]:
            read_answer(env.reset(seed=seed), self.where, f"reset(seed={seed})")
            results: list[Answer] = []
            for number, action in enumerate(actions, 1):
                results.append(read_answer(env.step(action), self.where,
                                           f"step {number} of the episode of seed {seed}"))
                if results[-1].done:
                    break
            return results

        return list(self.sessions.run(f"the episode of seed {seed}", play))

    def observation_text(self, result: Answer) -> str:
        """What the policy is shown of a step's observation (held to the prompt limit)."""
        return held_prompt(self._prompt_text(result.observation), self.where,
                           "a step of an episode")

    def _episode(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        """The reply's episode played: its reward and markers."""
        action = self.action.action_for(reply)
        if action is None:
            return 0.0, {"action_ok": 0.0}
        seed = int(case["seed"])
        try:
            result = self.replay(seed, [action])[-1]
        except PosttrainError as error:
            if "VALIDATION_ERROR" in str(error):  # the server refused the Action
                return 0.0, {"action_ok": 0.0}
            raise
        if not result.done:
            raise PosttrainError(
                f"{self.where}: the episode of seed {seed} is not done after the policy's "
                "reply: for episodes of several steps give --env-arg max_turns=N (each "
                "turn a step)")
        if result.reward is None:  # its type and size were checked as it was read
            raise PosttrainError(f"{self.where}: the episode of seed {seed} ended with no "
                                 "reward; a reward must be a finite number")
        return result.reward, {"action_ok": 1.0}

    def _graded(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        """The reply's episode, played once: ``score`` and ``markers`` read the same one."""
        return self._graded_replies.get(reply, case, lambda: self._episode(reply, case))

    def score_ahead(self, pairs: Sequence[tuple[str, Case]]) -> None:
        """Play these replies' episodes now, ``concurrency`` at a time (``ScoresAhead``)."""
        distinct = list({(reply, json.dumps(case, sort_keys=True, default=str)): (reply, case)
                         for reply, case in pairs}.values())
        self._at_once(lambda pair: self._graded(*pair), distinct)

    def score(self, reply: str, case: Case) -> float:
        """The observation's reward after the reply's step (0.0 when it makes no Action)."""
        return self._graded(reply, case)[0]

    def markers(self, reply: str, case: Case) -> dict[str, float]:
        """``action_ok``: the reply made an Action the server took."""
        return dict(self._graded(reply, case)[1])
