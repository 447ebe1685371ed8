"""An inspect_ai task as a posttrain environment: ``--env inspect:PKG/TASK`` or
``--env inspect:FILE.py@TASK``.

inspect_ai (UK AISI's eval framework) defines a task as a dataset of samples, a solver
(what happens before and around the model's turn) and scorers. This adapter loads the task
with inspect's own loader (a registered task of an installed package, or a ``@task``
function in a file, with ``--env-arg`` as the task's arguments) and maps it onto
posttrain's contract:

- **prompts** are the dataset's samples: the solver chain runs up to the point where it
  asks the model (``generate``), so a ``system_message``, ``prompt_template`` or
  ``chain_of_thought`` shapes the messages exactly as inspect would send them; the last
  user message is the prompt, the sample's id its scenario, its ``target`` and
  ``metadata`` travel as record fields;
- **categories** are ``metadata["category"]`` where a sample names one (one category,
  ``default``, otherwise);
- **the reward** is the task's first scorer run on the reply (inspect's ``TaskState``
  with the reply as the model's output; no model is run), ``value_to_float`` of its
  value (C 1, P 0.5, I 0; a dict value: the mean of its entries), clipped to [0, 1];
  every scorer's value is a marker, named as in inspect's logs (a dict value's entries
  as ``SCORER/KEY``).

A task whose solvers give the model tools with ``use_tools`` plays as multi-turn episodes
(``inspect_tools``). What cannot be mapped is refused when the task loads, naming the part
and why: a sandbox or sample files (posttrain provides no sandbox), agent solvers (not
mapped yet), solvers that post-process the model's answer (``multiple_choice``,
``self_critique``), a model-graded scorer without ``--env-judge-endpoint`` (with one, it
grades through ``inspect_judge``), and samples that
differ in the messages before the user's. The scorers are run once on the first sample's
own target when the task loads, so a scorer that asks a model (a custom grader) is refused
then, with its name; one that fails later on a reply is reported the same way, never
skipped.
"""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.envs.base import Case, Messages
from posttrain.envs.ecosystem.bridge import run_sync
from posttrain.envs.ecosystem.dataset_adapter import (
    DEFAULT_CATEGORY,
    DatasetAdapter,
    GroundTruthAgent,
    Sample,
    ScoreCache,
    clip,
    shared_prefix,
)
from posttrain.envs.ecosystem.inspect_judge import graded_by, judge_model
from posttrain.envs.ecosystem.spec import JudgeEndpoint
from posttrain.errors import PosttrainError

#: the model name the scorers see in their TaskState (no model runs)
POLICY_MODEL = "posttrain/policy"

# solvers posttrain cannot play, by inspect registry name, with the reason
_REFUSED_SOLVERS = {
    "basic_agent": "an agent loop (tools, retries) is not mapped yet",
    "react": "an agent loop (tools, retries) is not mapped yet",
    "human_agent": "a person plays the task",
    "bridge": "an external agent plays the task",
    "multiple_choice": "it formats the choices and parses the model's answer after the "
                       "model's turn, which a reply alone does not replay",
    "self_critique": "it asks the model again after its first answer",
}
# scorers that ask a model for the score
_MODEL_GRADED_SCORERS = {"model_graded_qa", "model_graded_fact"}


def _inspect() -> Any:
    try:
        import inspect_ai
    except ImportError:
        raise PosttrainError(
            "--env inspect:...: the inspect_ai package is not installed; install posttrain's "
            "ecosystem extra (pip install 'posttrain[ecosystem]', Python 3.11+)") from None
    return inspect_ai


def _short_name(name: str) -> str:
    """``inspect_ai/match`` -> ``match``: scorers are named this way in inspect's logs."""
    return name.rsplit("/", 1)[-1]


def _registry_name(item: Any) -> str:
    from inspect_ai._util.registry import is_registry_object, registry_info

    return registry_info(item).name if is_registry_object(item) else repr(item)


def _solvers(solver: Any) -> list[Any]:
    """The solver and, for a chain, every solver inside it."""
    inner = getattr(solver, "_solvers", None)
    if inner is None:
        return [solver]
    return [leaf for child in inner for leaf in _solvers(child)]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content or [])


def _plain(message: Any) -> dict[str, str]:
    return {"role": str(message.role), "content": _text(message.content)}


def load_task(target: str, args: dict[str, Any]) -> Any:
    """The one task ``target`` names (``PKG/TASK``, ``FILE.py@TASK`` or ``FILE.py`` with one
    task), built with ``args``, or a PosttrainError saying what was found instead."""
    _inspect()
    # inspect's own loader (what `inspect eval TARGET` uses): registered tasks of
    # installed packages first, then task files
    from pathlib import Path

    from inspect_ai._eval.loader import create_file_tasks, load_tasks

    where = f"--env inspect:{target}"
    try:
        if target.endswith(".py") and Path(target).is_file():
            # every task of one file (inspect's glob form takes relative paths only)
            tasks = create_file_tasks(Path(target).resolve(), None, args)
        else:
            tasks = load_tasks([target], args)
    except (ValueError, TypeError, OSError, ImportError, SyntaxError) as error:
        raise PosttrainError(f"{where}: {type(error).__name__}: {error}") from None
    except Exception as error:  # a task function raising anything else (PrerequisiteError)
        raise PosttrainError(f"{where}: the task failed to load: {error}") from None
    if not tasks:
        raise PosttrainError(
            f"{where}: no inspect task by that name; give PKG/TASK of an installed package "
            "that registers its tasks (the inspect_ai entry point) or FILE.py@TASK")
    if len(tasks) > 1:
        names = ", ".join(task.name for task in tasks)
        raise PosttrainError(f"{where}: the file defines {len(tasks)} tasks ({names}); "
                             "name one with FILE.py@TASK")
    return tasks[0]


def refusal(task: Any, target: str, judged: bool = False) -> str | None:
    """Why ``task`` cannot be a posttrain environment, or None when it can (``judged``: a
    grader model was given, ``--env-judge-endpoint``)."""
    where = f"inspect task {target!r}"
    if task.sandbox is not None:
        return f"{where}: not supported: it runs in a sandbox, which posttrain does not provide"
    if not task.scorer:
        return f"{where}: it has no scorer, so there is no reward"
    for solver in _solvers(task.solver):
        name = _short_name(_registry_name(solver))
        if name in _REFUSED_SOLVERS:
            return f"{where}: its solver {name} is not supported: {_REFUSED_SOLVERS[name]}"
    for scorer in task.scorer:
        name = _short_name(_registry_name(scorer))
        if name in _MODEL_GRADED_SCORERS and not judged:
            return (f"{where}: its scorer {name} asks a model to grade the reply: give one "
                    "with --env-judge-endpoint URL (an OpenAI-compatible API), or score "
                    "with scorers of the reply and target only")
    for index, sample in enumerate(task.dataset):
        if sample.sandbox is not None or sample.files or sample.setup:
            named = sample.id if sample.id is not None else index + 1
            return (f"{where}: sample {named!r} needs a sandbox (sandbox, files or setup), "
                    "which posttrain does not provide")
    return None


class _Asked(Exception):
    """Raised by the capturing ``generate``: the solver chain reached the model's turn."""


class InspectEnv(DatasetAdapter):
    """An inspect_ai task behind posttrain's ``Env`` contract (see the module docstring).
    Built by ``get_env("inspect:PKG/TASK?...")``."""

    #: a sample's target (a list of text) and metadata travel as prompt-file columns
    record_fields: ClassVar[dict[str, str]] = {"target": "array", "metadata": "object"}

    def __init__(self, target: str, args: dict[str, Any] | None = None,
                 task: Any | None = None, judge: JudgeEndpoint | None = None) -> None:
        self.target = target
        self.args = dict(args or {})
        self.task = task if task is not None else load_task(target, self.args)
        why = refusal(self.task, target, judged=judge is not None)
        if why:
            raise PosttrainError(why)
        self._judge = None
        if judge is not None:
            self._judge = judge_model(judge)
        self.name = _short_name(self.task.name)
        self.tools: list[dict[str, Any]] = []
        self._scorer_names = [_short_name(_registry_name(s)) for s in self.task.scorer]
        samples = list(self.task.dataset)
        #: the tools the solvers gave the model, per sample (``use_tools``)
        self._tools_seen: list[list[Any]] = []
        if not samples:
            raise PosttrainError(f"inspect task {target!r}: its dataset is empty")
        prompts: list[str] = []
        prefixes: list[list[dict[str, str]]] = []
        cases: list[tuple[str, dict[str, Any]]] = []
        for index, sample in enumerate(samples):
            messages = self._messages_before_generate(sample)
            if not messages or messages[-1]["role"] != "user":
                raise PosttrainError(
                    f"inspect task {target!r}: sample {sample.id!r}'s messages do not end with "
                    "the user's when the model is asked")
            prompts.append(messages[-1]["content"])
            prefixes.append(messages[:-1])
            fields: dict[str, Any] = {"target": self._targets(sample.target),
                      "metadata": dict(sample.metadata or {})}
            scenario = str(sample.id if sample.id is not None else index + 1)
            cases.append((scenario, fields))
        self._prefix = shared_prefix(prefixes, f"inspect task {target!r}")
        if any(self._tools_seen) and not getattr(self, "multi_turn", False):
            raise PosttrainError(
                f"inspect task {target!r}: a solver other than use_tools gives the model "
                "tools, which posttrain does not know how to play")
        system = [m for m in self._prefix if m["role"] == "system"]
        self.system = system[0]["content"] if system else ""
        self._keep_samples([Sample(prompt, scenario, fields)
                            for prompt, (scenario, fields) in zip(prompts, cases, strict=True)])
        self.categories = tuple(sorted({self.category(sample.fields)
                                        for sample in self._samples}))
        self._scores = ScoreCache()
        if not getattr(self, "multi_turn", False):  # a tool task probes once it is set up
            self._probe_scorers()

    def _probe_scorers(self) -> None:
        """Score the first sample's own target once, so a scorer that needs what posttrain
        does not give (a grader model, a sandbox) is refused when the task loads."""
        first = self._samples[0]
        self.scores_of((first.fields["target"] or [""])[0],
                       self.case_from_record(first.prompt, first.fields))

    @staticmethod
    def _targets(target: Any) -> list[str]:
        return [str(t) for t in target] if isinstance(target, list) else [str(target)]

    # -- prompts ---------------------------------------------------------------

    def _messages_before_generate(self, sample: Any) -> list[dict[str, str]]:
        """The messages the task's solvers send the model for ``sample``: the chain is run
        with a ``generate`` that records them and stops it."""
        from inspect_ai.model import ChatMessageUser, ModelName
        from inspect_ai.scorer import Target
        from inspect_ai.solver import TaskState

        start = ([ChatMessageUser(content=sample.input)] if isinstance(sample.input, str)
                 else list(sample.input))
        state = TaskState(model=ModelName(POLICY_MODEL), sample_id=sample.id or 0, epoch=1,
                          input=sample.input, messages=start, target=Target(sample.target),
                          metadata=dict(sample.metadata or {}))
        asked: list[Any] = []

        async def generate(state: Any, *args: Any, **kwargs: Any) -> Any:
            asked.extend(state.messages)
            self._tools_seen.append(list(state.tools or []))
            raise _Asked

        try:
            run_sync(self.task.solver(state, generate))
        except _Asked:
            return [_plain(message) for message in asked]
        except Exception as error:
            raise PosttrainError(
                f"inspect task {self.target!r}: its solver failed on sample {sample.id!r} "
                f"before the model's turn: {type(error).__name__}: {error}") from None
        raise PosttrainError(f"inspect task {self.target!r}: its solver never asks the model "
                             f"(sample {sample.id!r}), so there is no reply to train")

    def _unknown_prompt(self) -> str:
        return (f"inspect task {self.target!r}: the prompt is not one of its dataset's, so "
                "its target is unknown: give the sample's target and metadata in the prompts "
                "file")

    def category(self, case: Case) -> str:
        """``metadata["category"]`` when the sample names one, else ``default``."""
        metadata = case.get("metadata")
        if isinstance(metadata, dict):
            named = metadata.get("category")
            if isinstance(named, str) and named:
                return named
        return DEFAULT_CATEGORY

    def reference_agent(self, seed: int = 0) -> GroundTruthAgent:
        """Replies with the sample's target (the first of its targets the first scorer
        passes; ``GroundTruthAgent``)."""
        return GroundTruthAgent(self, lambda case: [str(t) for t in case.get("target") or []])

    # -- the reward --------------------------------------------------------------

    def scores_of(self, reply: str, case: Case) -> dict[str, Any]:
        """Each scorer's ``Score`` for ``reply``, by its name in inspect's logs."""
        from inspect_ai.model import ModelName, ModelOutput
        from inspect_ai.scorer import Target
        from inspect_ai.solver import TaskState

        messages, final = self.conversation(reply, case)
        target = Target(list(case.get("target") or []))
        state = TaskState(model=ModelName(POLICY_MODEL), sample_id=0, epoch=1,
                          input=case["prompt"], messages=messages, target=target,
                          output=ModelOutput.from_content(POLICY_MODEL, final),
                          metadata=dict(case.get("metadata") or {}))

        async def score_all() -> dict[str, Any]:
            scores = {}
            for name, scorer in zip(self._scorer_names, self.task.scorer, strict=True):
                try:
                    scores[name] = await scorer(state, target)
                except PosttrainError:
                    raise  # already one line that names its cause (e.g. the judge endpoint)
                except Exception as error:
                    raise PosttrainError(
                        f"inspect task {self.target!r}: its scorer {name} failed on a reply: "
                        f"{type(error).__name__}: {error} (a scorer that asks a model needs "
                        "--env-judge-endpoint URL)") from None
            return scores

        if self._judge is None:
            return run_sync(score_all())
        return run_sync(graded_by(self._judge, score_all()))

    def conversation(self, reply: str, case: Case) -> tuple[list[Any], str]:
        """The messages the scorers see (inspect's own types) and the model's final text:
        the prompt, then the reply."""
        from inspect_ai.model import ChatMessageAssistant

        messages = self._chat(self.messages_for(case["prompt"]))
        messages.append(ChatMessageAssistant(content=reply, model=POLICY_MODEL))
        return messages, reply

    @staticmethod
    def _chat(messages: Messages) -> list[Any]:
        from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

        kinds = {"system": ChatMessageSystem, "user": ChatMessageUser,
                 "assistant": ChatMessageAssistant}
        return [kinds[m["role"]](content=m["content"]) for m in messages]

    def _scored(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        def compute() -> tuple[float, dict[str, float]]:
            from inspect_ai.scorer import value_to_float

            as_float = value_to_float()
            values = {}
            for name, score in self.scores_of(reply, case).items():
                value = score.value
                if isinstance(value, dict):  # one scorer, several values: each a marker
                    parts = {f"{name}/{key}": clip(as_float(v)) for key, v in value.items()}
                    values[name] = sum(parts.values()) / len(parts) if parts else 0.0
                    values.update(parts)
                else:
                    values[name] = clip(as_float(value))
            return values[self._scorer_names[0]], values

        return self._scores.get(reply, case, compute)

    def score(self, reply: str, case: Case) -> float:
        """The first scorer's value on the reply, in [0, 1]."""
        return self._scored(reply, case)[0]

    def markers(self, reply: str, case: Case) -> dict[str, float]:
        """Every scorer's value on the reply, in [0, 1] (a dict value's entries as
        ``SCORER/KEY`` too)."""
        return dict(self._scored(reply, case)[1])
