"""A multi-step OpenEnv environment as a posttrain multi-turn environment:
``--env openenv:TARGET --env-arg max_turns=N`` (N above 1).

An OpenEnv episode is ``reset()``, then one ``step(action)`` per policy move until the
observation says ``done``. posttrain's multi-turn contract plays tool turns
(``posttrain.envs.base``, "multi-turn"), so the environment's Action is one tool, ``act``,
whose parameters are the Action's fields (``/schema``): each policy turn that calls
``act(...)`` is a step, the observation comes back as the tool's result (its text field,
with the step's reward and whether the episode is done), and a turn without a call, a
done episode or ``max_turns`` turns end it. The reward is the episode's last reward
(``--env-arg reward=sum``: their sum); an episode the policy left before ``done`` scores
its last reward so far (0.0 with none).

The server's environment is stateful, posttrain's desk and its reward are replays: a
desk keeps the episode's actions and, for each new one, plays ``reset(seed)`` and every
action so far on one of the adapter's sessions (``openenv_sessions``: so a server that
allows one session at a time is enough; concurrent episodes share what it allows); the
reward plays the reply's actions once more, once per reply. That takes an environment
whose episodes are the same for the same seed and actions, which is what a seeded
``reset`` promises.

TRL's GRPO plays the same desk through ``trl_environment()``: a class whose ``act``
method has the Action's fields as parameters (with their JSON types and descriptions).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Case, Messages
from posttrain.envs.ecosystem.openenv_env import OpenEnvEnv
from posttrain.envs.ecosystem.tool_desk import with_system
from posttrain.envs.wire import WIRE_FORMAT, parse_tool_calls, split_turns

TOOL_NAME = "act"
_PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool,
                 "array": list, "object": dict}


@dataclass
class StepDesk:
    """One episode on an OpenEnv server: the actions taken, replayed for each new one."""

    env: OpenEnvStepsEnv
    seed: int
    actions: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    done: bool = False
    calls: list[tuple[str, dict[str, Any], str, bool]] = field(default_factory=list)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """One step: the observation as text, or why the call is no Action (as text)."""
        action = self.env.action.checked(arguments) if name == TOOL_NAME else None
        if action is None:
            text = (f"not an Action: call {TOOL_NAME} with its fields "
                    f"({', '.join(self.env.action.fields)})")
            self.calls.append((name, dict(arguments), text, False))
            return text
        results = self.env.replay(self.seed, [*self.actions, action])
        self.actions.append(action)
        last = results[-1]
        reward = last.reward  # checked as it was read (openenv_answers)
        if reward is not None:
            self.rewards.append(reward)
        self.done = last.done
        text = self.env.observation_text(last) + (
            f"\n(reward {reward:g}{', done' if self.done else ''})" if reward is not None
            else ("\n(done)" if self.done else ""))
        self.calls.append((name, dict(arguments), text, True))
        return text

    def episode_reward(self, reward_of: str) -> float:
        if not self.rewards:
            return 0.0
        return sum(self.rewards) if reward_of == "sum" else self.rewards[-1]


class OpenEnvStepsEnv(OpenEnvEnv):
    """A multi-step OpenEnv environment behind posttrain's multi-turn contract."""

    multi_turn = True

    def __init__(self, target: str, args: dict[str, Any] | None = None) -> None:
        super().__init__(target, args)
        properties = {name: {"type": sorted(kinds)[0] if kinds else "string"}
                      for name, kinds in self.action.fields.items()}
        self.tools = [{"type": "function", "function": {
            "name": TOOL_NAME,
            "description": "Take one step in the environment with this action; returns "
                           "what the environment shows next.",
            "parameters": {"type": "object", "properties": properties,
                           "required": list(self.action.required)}}}]
        listed = json.dumps(self.tools[0]["function"], separators=(",", ":"))
        self.system = (f"{self.system}\n\n" if self.system else "") + (
            f"Tools:\n{listed}\n\n{WIRE_FORMAT}")

    def messages_for(self, prompt: str) -> Messages:
        return with_system(super().messages_for(prompt), self.system)

    def new_desk(self, case: Case) -> StepDesk:
        return StepDesk(self, int(case["seed"]))

    def _played(self, reply: str, case: Case) -> tuple[StepDesk, dict[str, Any]]:
        """The reply's turns replayed on a fresh desk, and the episode's counts."""
        desk = self.new_desk(case)
        summary: dict[str, Any] = {"turns": 0, "tool_calls": 0, "failed_calls": 0,
                                   "ended": "turn_limit"}
        for turn in split_turns(reply)[: self.max_turns]:
            summary["turns"] += 1
            calls = parse_tool_calls(turn)
            if not calls:
                summary["ended"] = "reply"
                break
            for call in calls:
                desk.call(call["name"], call["arguments"])
                if desk.done:
                    break
            if desk.done:
                summary["ended"] = "done"
                break
        summary["tool_calls"] = len(desk.calls)
        summary["failed_calls"] = sum(not ok for *_, ok in desk.calls)
        return desk, summary

    def _episode(self, reply: str, case: Case) -> tuple[float, dict[str, float]]:
        """The episode's last reward (or their sum, ``reward=sum``), 0.0 with none; markers
        ``done`` (the episode ended) and ``action_ok`` (every call made an Action). The
        inherited ``score``/``markers`` read it, played once per reply."""
        desk, summary = self._played(reply, case)
        return desk.episode_reward(self.reward_of), {
            "done": 1.0 if summary["ended"] == "done" else 0.0,
            "action_ok": 0.0 if summary["failed_calls"] else 1.0}

    def episode_summary(self, reply: str, case: Case) -> dict[str, Any]:
        return self._played(reply, case)[1]

    def trl_environment(self) -> type:
        """The class TRL's ``environment_factory`` instantiates (one per rollout): ``reset``
        reads the episode's seed from the ``case`` column, ``act`` takes a step."""
        env = self
        parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        annotations: dict[str, Any] = {"return": str}
        described = []
        for name, kinds in env.action.fields.items():
            kind = _PYTHON_TYPES.get(sorted(kinds)[0] if kinds else "string", str)
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                                annotation=kind))
            annotations[name] = kind
            described.append(f"    {name}: the Action's {name}.")

        def reset(self: Any, **row: Any) -> None:
            case = row.get("case")
            case = json.loads(case) if isinstance(case, str) else dict(case or {})
            self.desk = env.new_desk(case)

        def act(self: Any, **fields: Any) -> str:
            return str(self.desk.call(TOOL_NAME, fields))

        act.__doc__ = ("Take one step in the environment with this action; returns what "
                       "the environment shows next.\n\nArgs:\n" + "\n".join(described))
        act.__annotations__ = annotations
        vars(act)["__signature__"] = inspect.Signature(parameters, return_annotation=str)
        return type("OpenEnvStepDesk", (), {
            "__init__": lambda self: setattr(self, "desk", env.new_desk({"seed": 0})),
            "reset": reset, TOOL_NAME: act,
            "__doc__": f"The steps of {env.where}."})
