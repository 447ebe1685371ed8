"""A verifiers environment as a posttrain environment: ``--env verifiers:ENV_ID``.

verifiers (PrimeIntellect's library; the Environments Hub's packages are written against
it) loads an environment with ``load_environment(env_id, **args)``: an installed package
whose module (``env_id`` with ``-`` as ``_``) defines ``load_environment``. This adapter
takes the classic API (``vf.Environment``, a ``Rubric`` of reward functions, a dataset
with ``prompt``/``answer``/``info``/``task`` columns; verifiers 0.3.1, where the
Hub's packages live) and maps it onto posttrain's contract:

- **prompts** are the dataset's rows (``write_prompts``): the user message is the prompt,
  the row's ``example_id`` its scenario, its ``answer``/``info``/``task`` travel as the
  record's fields (``record_fields``), so a ``--prompts-file`` must carry them too;
- **categories** are the ``task`` column's text values, else ``info["category"]`` (one
  category, ``default``, without either);
- **the reward** is the environment's own rubric run on the reply (``score_rollout``), its
  weighted sum clipped to [0, 1] (a pass is 1.0, as for every posttrain rule); each
  reward function's value, clipped the same way, is a marker;
- the system prompt and any few-shot messages the dataset puts before the user's are
  what the policy sees (``messages_for``).

What cannot be mapped is refused when the environment loads, naming the part and why
(``refusal``): a judge rubric without ``--env-judge-endpoint`` (it needs a model; with
one, its judge client calls that endpoint), group-level reward functions (they
score a group, posttrain scores a reply), sandboxes and stateful tools, multi-turn
environments whose turns are the environment's own code, and prompts that differ in their
earlier messages. Nothing is silently skipped.
"""

from __future__ import annotations

import os
from typing import Any

from posttrain.envs.base import Case
from posttrain.envs.ecosystem.bridge import run_sync
from posttrain.envs.ecosystem.dataset_adapter import (
    DEFAULT_CATEGORY,
    DatasetAdapter,
    GroundTruthAgent,
    Sample,
    ScoreCache,
    answer_spellings,
    clip,
    shared_prefix,
)
from posttrain.envs.ecosystem.spec import JudgeEndpoint
from posttrain.errors import PosttrainError

#: JSON type names of the columns that travel as record fields
_JSON_TYPES = ((bool, "boolean"), (int, "number"), (float, "number"), (str, "string"),
               (dict, "object"), (list, "array"))

# environment classes posttrain cannot play, most specific first, with the reason
_REFUSED_CLASSES = (
    ("PythonEnv", "runs the policy's code in a sandbox, which posttrain does not provide"),
    ("SandboxEnv", "runs tools in a sandbox, which posttrain does not provide"),
    ("StatefulToolEnv", "its tools keep state between calls (injected per rollout), which "
                        "posttrain's replay of a reply cannot rebuild"),
    ("MCPEnv", "its tools are MCP servers (stateful processes), not plain functions"),
    ("CliAgentEnv", "it runs an agent program, not a policy's replies"),
    ("HarborEnv", "it runs tasks in containers"),
    ("BrowserEnv", "it drives a browser"),
    ("GymEnv", "its turns are a simulator's steps"),
    ("TextArenaEnv", "its turns are a game engine's moves"),
    ("OpenEnvEnv", "its turns come from an OpenEnv server"),
    ("EnvGroup", "it routes each row to a sub-environment; load the sub-environments "
                 "one at a time"),
)


def import_verifiers() -> Any:
    try:
        import verifiers
    except ImportError:
        raise PosttrainError(
            "--env verifiers:...: the verifiers package is not installed; install "
            "posttrain's ecosystem extra (pip install 'posttrain[ecosystem]', Python 3.11+)"
        ) from None
    return verifiers


def load_verifiers(env_id: str, args: dict[str, Any], judge: JudgeEndpoint | None = None
                   ) -> Any:
    """The verifiers environment ``env_id`` loads with ``args``, its judge rubrics pointed at
    ``judge`` when one is given, or a PosttrainError saying why it cannot load or cannot be
    a posttrain environment (``refusal``)."""
    vf = import_verifiers()
    try:
        vf_env = vf.load_environment(env_id, **args)
    except (ValueError, RuntimeError, TypeError) as error:
        raise PosttrainError(f"--env verifiers:{env_id}: {error}") from None
    why = refusal(vf_env, env_id, judged=judge is not None)
    if why:
        raise PosttrainError(why)
    if judge is not None:
        point_judges_at(vf_env.rubric, judge)
    return vf_env


def point_judges_at(rubric: Any, judge: JudgeEndpoint) -> None:
    """Every ``JudgeRubric`` under ``rubric`` calls ``judge`` (``--env-judge-endpoint``)."""
    vf = import_verifiers()
    from openai import AsyncOpenAI

    for leaf in _rubrics(rubric):
        if isinstance(leaf, vf.JudgeRubric):
            leaf.judge_client = AsyncOpenAI(base_url=judge.url,
                                            api_key=os.environ.get(judge.key_env) or "no-key")
            leaf.judge_model = judge.model or leaf.judge_model
            # the reward functions receive these by name, from class_objects
            leaf.class_objects.update(judge_client=leaf.judge_client,
                                      judge_model=leaf.judge_model)


def refusal(vf_env: Any, env_id: str, judged: bool = False) -> str | None:
    """Why ``vf_env`` cannot be a posttrain environment, or None when it can."""
    vf = import_verifiers()
    where = f"verifiers environment {env_id!r} ({type(vf_env).__name__})"
    # by name along the class's ancestry: verifiers imports its integrations' classes
    # lazily, and asking for one whose extra is missing raises ImportError
    ancestry = {cls.__name__ for cls in type(vf_env).__mro__}
    for class_name, why in _REFUSED_CLASSES:
        if class_name in ancestry:
            return f"{where}: not supported: {why}"
    if isinstance(vf_env, vf.ToolEnv):
        if type(vf_env).env_response is not vf.ToolEnv.env_response:
            return (f"{where}: its env_response is its own code (a ToolEnv subclass), which "
                    "posttrain's replay of the tool calls cannot rebuild")
        if any(not callable(tool) for tool in vf_env.tool_map.values()):
            return f"{where}: a tool that is not a plain Python function"
    elif getattr(vf_env, "tool_defs", None):
        return (f"{where}: it declares tools without being a ToolEnv, so posttrain does "
                "not know how they run")
    elif not isinstance(vf_env, vf.SingleTurnEnv):
        return (f"{where}: a multi-turn environment whose env_response is its own code "
                "cannot be replayed from a reply; posttrain plays SingleTurnEnv and ToolEnv")
    for rubric in _rubrics(vf_env.rubric):
        if isinstance(rubric, vf.JudgeRubric) and not judged:
            return (f"{where}: its rubric {type(rubric).__name__} asks a judge model for the "
                    "reward: give one with --env-judge-endpoint URL (an OpenAI-compatible "
                    "API), or score with reward functions of the reply only")
        group = [getattr(func, "__name__", repr(func)) for func in rubric.funcs
                 if rubric._is_group_func(func)]
        if group:
            return (f"{where}: reward function(s) {', '.join(group)} score a group of "
                    "rollouts together; posttrain scores one reply at a time")
    return None


def _rubrics(rubric: Any) -> list[Any]:
    """The rubric and, for a RubricGroup, every rubric inside it."""
    inner = getattr(rubric, "rubrics", None)
    if inner is None:
        return [rubric]
    return [leaf for child in inner for leaf in _rubrics(child)]


def _json_type(value: Any) -> str | None:
    for python_type, name in _JSON_TYPES:
        if isinstance(value, python_type):
            return name
    return None


def _plain(message: Any) -> dict[str, str]:
    if isinstance(message, dict):
        return {"role": str(message["role"]), "content": str(message.get("content") or "")}
    return {"role": str(message.role), "content": str(message.content or "")}


class VerifiersEnv(DatasetAdapter):
    """A classic-API verifiers environment behind posttrain's ``Env`` contract (see the
    module docstring). Built by ``get_env("verifiers:ENV_ID?...")``."""

    def __init__(self, env_id: str, args: dict[str, Any] | None = None,
                 vf_env: Any | None = None, judge: JudgeEndpoint | None = None) -> None:
        self.env_id = env_id
        self.args = dict(args or {})
        self.vf_env = vf_env if vf_env is not None else load_verifiers(env_id, self.args, judge)
        self.name = env_id
        self.tools: list[dict[str, Any]] = []
        rows = [dict(row) for row in self.vf_env.get_dataset()]
        if not rows:
            raise PosttrainError(f"verifiers environment {env_id!r}: its dataset is empty")
        self._prefix = self._shared_prefix(rows)
        system = [m for m in self._prefix if m["role"] == "system"]
        self.system = system[0]["content"] if system else (self.vf_env.system_prompt or "")
        self.record_fields = {name: kind for name in ("answer", "info", "task")
                              if name in rows[0] and (kind := _json_type(rows[0][name]))}
        self.categories = tuple(sorted({self.category(self._fields(row)) for row in rows}))
        self._keep_samples([Sample(self._user_text(row), str(row.get("example_id", index)),
                                   self._fields(row)) for index, row in enumerate(rows)])
        self._scores = ScoreCache()

    # -- prompts ---------------------------------------------------------------

    def _shared_prefix(self, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
        """The messages before the user's, the same in every row (or a refusal)."""
        prefixes = []
        for row in rows:
            prompt = row.get("prompt")
            if not isinstance(prompt, list) or not prompt:
                raise PosttrainError(
                    f"verifiers environment {self.env_id!r}: row {row.get('example_id')} has "
                    "no chat prompt (a list of messages); completion-style prompts are not "
                    "mapped")
            messages = [_plain(message) for message in prompt]
            if messages[-1]["role"] != "user":
                raise PosttrainError(
                    f"verifiers environment {self.env_id!r}: row {row.get('example_id')}'s "
                    "prompt does not end with the user's message")
            prefixes.append(messages[:-1])
        return shared_prefix(prefixes, f"verifiers environment {self.env_id!r}")

    def _user_text(self, row: dict[str, Any]) -> str:
        return _plain(row["prompt"][-1])["content"]

    def _fields(self, row: dict[str, Any]) -> dict[str, Any]:
        return {name: row[name] for name in self.record_fields}

    def _unknown_prompt(self) -> str:
        return (f"verifiers environment {self.env_id!r}: the prompt is not one of its "
                "dataset's, so its answer is unknown: give the row's columns "
                f"({', '.join(self.record_fields)}) in the prompts file")

    def category(self, case: Case) -> str:
        """A text ``task`` column (older datasets); else ``info["category"]`` (verifiers
        0.3.1 reads a ``task`` column, and ``info["task"]``, as a JSON task payload, not
        as a label); else one category, ``default``."""
        task = case.get("task")
        if isinstance(task, str) and task and not task.lstrip().startswith("{"):
            return task
        info = case.get("info")
        if isinstance(info, dict):
            if isinstance(info.get("category"), str) and info["category"]:
                return str(info["category"])
        return DEFAULT_CATEGORY

    def reference_agent(self, seed: int = 0) -> GroundTruthAgent:
        """Replies with the row's ``answer``, formatted the way the environment's parser
        writes it where it can (an ``XMLParser``), else bare or in an ``<answer>`` tag:
        the first spelling the rubric passes (``GroundTruthAgent``)."""
        return GroundTruthAgent(self, self._truth_spellings)

    def _truth_spellings(self, case: Case) -> list[str]:
        answer = case.get("answer")
        spellings = answer_spellings(answer)
        parser = getattr(self.vf_env, "parser", None)
        field = getattr(parser, "answer_field", None)
        write = getattr(parser, "format", None)
        if spellings and field and callable(write):
            try:
                spellings.insert(0, str(write(**{field: str(answer).strip()})))
            except (TypeError, ValueError, KeyError):
                pass  # a parser whose format wants other fields: the plain spellings
        return spellings

    # -- the reward --------------------------------------------------------------

    def rubric_state(self, reply: str, case: Case) -> Any:
        """The state verifiers' rubric scores: the prompt, the row's columns and the reply
        as the completion, after the rubric ran (``state["reward"]``, ``["metrics"]``)."""
        vf = import_verifiers()
        from verifiers.utils.message_utils import normalize_messages

        row_input: dict[str, Any] = {
            "prompt": normalize_messages(self.messages_for(case["prompt"])),
            "example_id": 0,
            **{name: case[name] for name in self.record_fields if name in case},
        }
        state = vf.State(input=row_input)
        completion = normalize_messages([{"role": "assistant", "content": reply}])
        state["completion"] = completion
        # one step, as a rollout of one turn records (its monitor's num_turns reads it)
        state["trajectory"] = [{"prompt": row_input["prompt"], "completion": completion,
                                "response": None, "tokens": None, "reward": None,
                                "advantage": None, "is_truncated": False,
                                "trajectory_id": "posttrain", "extras": {}}]
        run_sync(self.vf_env.rubric.score_rollout(state))
        return state

    def _scored(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        def compute() -> tuple[float, dict[str, float]]:
            state = self.rubric_state(reply, case)
            metrics = {name: clip(value) for name, value in (state["metrics"] or {}).items()}
            return clip(state["reward"]), metrics

        return self._scores.get(reply, case, compute)

    def score(self, reply: str, case: Case) -> float:
        """The rubric's weighted sum on the reply, clipped to [0, 1]."""
        return self._scored(reply, case)[0]

    def markers(self, reply: str, case: Case) -> dict[str, float]:
        """Each of the rubric's functions on the reply, clipped to [0, 1]."""
        return dict(self._scored(reply, case)[1])

