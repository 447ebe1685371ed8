"""A verifiers v1 taskset (``Taskset`` / ``Task``) as a posttrain environment.

verifiers' v1 API (the only one 0.4 keeps; 0.3.1 ships it beside the classic one) writes an
environment as a ``Taskset`` subclass, exported through its module's ``__all__``, whose
``load()`` returns ``Task`` objects: frozen ``TaskData`` (the prompt, a system prompt, any
fields of the task's own) and the task's ``@vf.reward`` / ``@vf.metric`` functions of a
``Trace``. ``--env verifiers:ENV_ID`` loads one when the package defines no classic
``load_environment``; ``--env-arg`` values are the taskset config's fields.

- **prompts** are the tasks: the prompt text is the prompt, the task's ``idx`` (else its
  position) its scenario, its whole data (``model_dump``) travels in one ``task_data``
  field, from which scoring rebuilds the task;
- **categories** are a text ``category`` field of the task's data (one category,
  ``default``, otherwise);
- **the reward** is ``Task.score`` on a trace of the prompt and the reply (no model, no
  runtime): the weighted sum of its rewards, clipped to [0, 1]; each reward and metric,
  clipped the same way, is a marker.

Refused when the taskset loads, with the part and why: tasks that need a container or a
runtime (verifiers would skip a runtime-dependent reward without one and still report the
rest: posttrain will not), tool servers (``toolsets``, MCP processes), judges (they need a
model), a prompt that is a list of messages, and tasks that differ in their system prompt.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

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


def _v1() -> Any:
    import verifiers.v1 as vf  # the ecosystem extra; import_verifiers() checked it is there

    return vf


def is_v1_taskset(env_id: str) -> bool:
    """Does ``env_id``'s module define a v1 ``Taskset`` and no classic ``load_environment``?
    (False when it cannot be imported: the classic loader then says why.)"""
    from verifiers.v1.utils.loaders import import_taskset

    try:
        module = import_taskset(env_id)
    except ModuleNotFoundError:
        return False
    if hasattr(module, "load_environment"):
        return False
    vf = _v1()
    return any(isinstance(obj, type) and issubclass(obj, vf.Taskset) and obj is not vf.Taskset
               for obj in (getattr(module, name, None) for name in getattr(module, "__all__", ())))


def _requires_runtime(function: Any) -> bool:
    # what Task.score skips without a runtime: a `runtime` parameter with no default
    parameter = inspect.signature(function).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _judged_by(task: Any, judge: JudgeEndpoint) -> Any:
    """``task`` with every judge of its config calling ``judge`` (``--env-judge-endpoint``):
    v1 judges read their endpoint, model and key variable from their config."""
    if not task.config.judges:
        return task
    update: dict[str, Any] = {"base_url": judge.url, "api_key_var": judge.key_env}
    if judge.model:
        update["model"] = judge.model
    judges = [config.model_copy(update=update) for config in task.config.judges]
    return type(task)(task.data, task.config.model_copy(update={"judges": judges}))


def refusal(taskset_class: Any, config: Any, tasks: list[Any], env_id: str,
            judged: bool = False) -> str | None:
    """Why the taskset cannot be a posttrain environment, or None when it can (every task
    is checked: one task that needs a container is enough to refuse)."""
    where = f"verifiers taskset {env_id!r} ({taskset_class.__name__})"
    if taskset_class.toolsets(config):
        return (f"{where}: its tools are MCP servers (toolsets), stateful processes rather "
                "than plain functions")
    checked: set[type] = set()
    for task in tasks:
        task_class = type(task)
        if task_class.NEEDS_CONTAINER or task.data.image:
            return f"{where}: its tasks run in a container, which posttrain does not provide"
        if task.config.judges and not judged:
            return (f"{where}: a judge scores its tasks: give it a model with "
                    "--env-judge-endpoint URL (an OpenAI-compatible API), or score with "
                    "reward functions of the trace only")
        if not isinstance(task.data.prompt, str):
            return (f"{where}: a task's prompt is a list of messages; posttrain maps tasks "
                    "whose prompt is one user message")
        if task_class in checked:
            continue
        checked.add(task_class)
        if task_class.toolsets(task.config):
            return (f"{where}: its tools are MCP servers (toolsets), stateful processes "
                    "rather than plain functions")
        needs_runtime = [fn.__name__ for kind in ("reward", "metric")
                         for fn in task.hooks(kind) if _requires_runtime(fn)]
        if needs_runtime:
            return (f"{where}: {', '.join(needs_runtime)} need(s) a runtime (a sandbox), "
                    "which posttrain does not provide; verifiers would skip them and report "
                    "the rest")
        if not task.hooks("reward"):
            return f"{where}: its tasks have no reward function"
    return None


class VerifiersTasksetEnv(DatasetAdapter):
    """A verifiers v1 taskset behind posttrain's ``Env`` contract (module docstring)."""

    #: the task's data, whole: scoring rebuilds the task from it
    record_fields: ClassVar[dict[str, str]] = {"task_data": "object"}

    def __init__(self, env_id: str, args: dict[str, Any] | None = None,
                 judge: JudgeEndpoint | None = None) -> None:
        from pydantic import ValidationError
        from verifiers.v1.utils.loaders import taskset_class, taskset_config_type

        self.env_id = env_id
        self.args = dict(args or {})
        self.name = env_id
        self.tools: list[dict[str, Any]] = []
        where = f"--env verifiers:{env_id}"
        try:
            self._taskset_class = taskset_class(env_id)
            config = taskset_config_type(env_id).model_validate({"id": env_id, **self.args})
            self._tasks = list(self._taskset_class(config))
            if judge is not None:
                self._tasks = [_judged_by(task, judge) for task in self._tasks]
        except ValidationError as error:
            raise PosttrainError(f"{where}: the taskset's arguments: {error}") from None
        except (ValueError, TypeError, AttributeError, RuntimeError) as error:
            raise PosttrainError(f"{where}: {error}") from None
        if not self._tasks:
            raise PosttrainError(f"verifiers taskset {env_id!r}: it loads no tasks")
        why = refusal(self._taskset_class, config, self._tasks, env_id,
                      judged=judge is not None)
        if why:
            raise PosttrainError(why)
        if len({type(task) for task in self._tasks}) > 1:
            raise PosttrainError(f"verifiers taskset {env_id!r}: its tasks are of several "
                                 "Task classes; posttrain maps a taskset of one")
        self._task_class = type(self._tasks[0])
        self._task_config = self._tasks[0].config
        prefixes = [[{"role": "system", "content": task.data.system_prompt}]
                    if task.data.system_prompt else [] for task in self._tasks]
        self._prefix = shared_prefix(prefixes, f"verifiers taskset {env_id!r}")
        self.system = self._prefix[0]["content"] if self._prefix else ""
        self._keep_samples([
            Sample(str(task.data.prompt),
                   str(task.data.idx if task.data.idx is not None else index),
                   {"task_data": task.data.model_dump(mode="json")})
            for index, task in enumerate(self._tasks)])
        self.categories = tuple(sorted({
            self.category(self.case_from_record(sample.prompt, sample.fields))
            for sample in self._samples}))
        self._scores = ScoreCache()

    def case_from_record(self, prompt: str, fields: dict[str, Any]) -> Case:
        return {"prompt": prompt, "task_data": dict(fields["task_data"])}

    def _unknown_prompt(self) -> str:
        return (f"verifiers taskset {self.env_id!r}: the prompt is not one of its tasks', so "
                "its data is unknown: give the task's data as the task_data field of the "
                "prompts file")

    def category(self, case: Case) -> str:
        """The task data's text ``category`` field, else ``default``."""
        named = (case.get("task_data") or {}).get("category")
        return named if isinstance(named, str) and named else DEFAULT_CATEGORY

    def reference_agent(self, seed: int = 0) -> GroundTruthAgent:
        """Replies with the task data's ``answer`` field, bare or in an ``<answer>`` tag,
        whichever the task's rewards pass (``GroundTruthAgent``)."""
        return GroundTruthAgent(
            self, lambda case: answer_spellings((case.get("task_data") or {}).get("answer")))

    # -- the reward --------------------------------------------------------------

    def trace_for(self, reply: str, case: Case) -> Any:
        """The task's trace of the prompt and the reply, after ``Task.score`` ran on it."""
        vf = _v1()
        data = self._task_class.data_type().model_validate(case["task_data"])
        task = self._task_class(data, self._task_config)
        trace = vf.Trace(
            task=vf.TraceTask(type=self._task_class.__name__, data=data),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=[vf.MessageNode(message=vf.UserMessage(content=case["prompt"])),
                   vf.MessageNode(parent=0, message=vf.AssistantMessage(content=reply),
                                  sampled=True)])
        run_sync(task.score(trace))
        return trace

    def _scored(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        def compute() -> tuple[float, dict[str, float]]:
            trace = self.trace_for(reply, case)
            markers = {name: clip(reward.score) for name, reward in trace.rewards.items()
                       if reward is not None}
            markers.update({name: clip(value) for name, value in trace.metrics.items()
                            if value is not None})
            return clip(trace.reward), markers

        return self._scores.get(reply, case, compute)

    def score(self, reply: str, case: Case) -> float:
        """The task's weighted rewards on the reply, summed and clipped to [0, 1]."""
        return self._scored(reply, case)[0]

    def markers(self, reply: str, case: Case) -> dict[str, float]:
        """Each reward's score and each metric on the reply, clipped to [0, 1]."""
        return dict(self._scored(reply, case)[1])
