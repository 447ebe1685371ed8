"""A verifiers ``ToolEnv`` as a posttrain multi-turn environment.

verifiers' ``ToolEnv`` gives the model plain Python functions as tools: each assistant
turn with tool calls gets the functions' results back as tool messages, and a turn without
calls ends the rollout (or ``max_turns``). posttrain plays the same episode
(``posttrain.envs.base``, "multi-turn"):

- the policy sees the environment's system prompt, the tools (one JSON schema a line, as
  verifiers derives them) and posttrain's ``<tool_call>`` wire format; an endpoint gets the
  tools as OpenAI tools instead;
- the desk (``tool_desk.ToolDesk``) runs a call on the environment's own ``tool_map``
  function and formats a failure with the environment's ``error_formatter``, as
  ``ToolEnv.env_response`` does;
- the reward replays the policy's turns on a fresh desk (never trusting a result written in
  the text), rebuilds the completion verifiers would hold (assistant turns with
  ``tool_calls``, tool messages) and runs the environment's rubric on it (its
  ``ToolMonitorRubric`` counts included), clipped to [0, 1];
- TRL's GRPO plays the same desk through ``trl_environment()``: a class made for the
  environment whose methods are its tools, with their signatures and docstrings.

``posttrain.envs.ecosystem.verifiers_environment`` picks this class for a ``ToolEnv``.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.envs.base import Case, Messages
from posttrain.envs.ecosystem.bridge import run_sync
from posttrain.envs.ecosystem.tool_desk import (
    ToolDesk,
    tool_desk_class,
    turn_text,
    with_system,
)
from posttrain.envs.ecosystem.verifiers_env import VerifiersEnv, import_verifiers
from posttrain.envs.wire import WIRE_FORMAT, parse_tool_calls, split_turns


class VerifiersToolEnv(VerifiersEnv):
    """A verifiers ``ToolEnv`` behind posttrain's multi-turn contract (module docstring)."""

    multi_turn = True

    def __init__(self, env_id: str, args: dict[str, Any] | None, vf_env: Any) -> None:
        super().__init__(env_id, args, vf_env)
        self.max_turns = int(vf_env.max_turns) if vf_env.max_turns and vf_env.max_turns > 0 \
            else 10
        self.tools = [{"type": "function",
                       "function": tool.model_dump(include={"name", "description",
                                                            "parameters"})}
                      for tool in vf_env.tool_defs or []]
        listed = "\n".join(json.dumps(tool["function"], separators=(",", ":"))
                           for tool in self.tools)
        self._vf_system = self.system
        self.system = (f"{self.system}\n\n" if self.system else "") + \
            f"Tools:\n{listed}\n\n{WIRE_FORMAT}"

    def messages_for(self, prompt: str) -> Messages:
        return with_system(super().messages_for(prompt), self.system)

    def new_desk(self, case: Case) -> ToolDesk:
        """A fresh episode: the environment's tools, nothing called yet."""
        return ToolDesk(dict(self.vf_env.tool_map), self.vf_env.error_formatter)

    # -- the reward: replay, then the rubric -------------------------------------------

    def replay(self, reply: str, case: Case) -> tuple[list[Any], dict[str, Any]]:
        """The completion verifiers would hold for the policy's turns (tool calls run on a
        fresh desk), and the episode's counts."""
        vf = import_verifiers()
        desk = self.new_desk(case)
        completion: list[Any] = []
        summary: dict[str, Any] = {"turns": 0, "tool_calls": 0, "failed_calls": 0,
                                   "ended": "turn_limit"}
        for index, turn in enumerate(split_turns(reply)[: self.max_turns]):
            summary["turns"] += 1
            calls = parse_tool_calls(turn)
            if not calls:  # prose, or a broken block: the episode's last turn
                completion.append(vf.AssistantMessage(content=turn))
                summary["ended"] = "reply"
                break
            tool_calls = [vf.ToolCall(id=f"call_{index}_{number}", name=call["name"],
                                      arguments=json.dumps(call["arguments"]))
                          for number, call in enumerate(calls)]
            completion.append(vf.AssistantMessage(content=turn_text(turn) or None,
                                                  tool_calls=tool_calls))
            for tool_call, call in zip(tool_calls, calls, strict=True):
                result = desk.call(call["name"], call["arguments"])
                completion.append(vf.ToolMessage(content=result, tool_call_id=tool_call.id))
        summary["tool_calls"] = len(desk.calls)
        summary["failed_calls"] = sum(not ok for *_, ok in desk.calls)
        return completion, summary

    def rubric_state(self, reply: str, case: Case) -> Any:
        """The state verifiers' rubric scores: the prompt, the row's columns and the
        replayed episode as the completion, after the rubric ran."""
        vf = import_verifiers()
        from verifiers.utils.message_utils import normalize_messages

        prompt = normalize_messages(self._vf_messages(case["prompt"]))
        completion, _ = self.replay(reply, case)
        state = vf.State(input={"prompt": prompt, "example_id": 0,
                                **{name: case[name] for name in self.record_fields
                                   if name in case}})
        state["completion"] = completion
        assistant_turns = [m for m in completion if m.role == "assistant"]
        state["trajectory"] = [{"prompt": prompt, "completion": [turn], "response": None,
                                "tokens": None, "reward": None, "advantage": None,
                                "is_truncated": False, "trajectory_id": "posttrain",
                                "extras": {}} for turn in assistant_turns]
        run_sync(self.vf_env.rubric.score_rollout(state))
        return state

    def _vf_messages(self, prompt: str) -> Messages:
        """The prompt as verifiers holds it (its own system prompt; the tools go apart)."""
        return VerifiersEnv.messages_for(self, prompt)

    def episode_summary(self, reply: str, case: Case) -> dict[str, Any]:
        """Turns, tool calls, failed calls and how the episode ended."""
        return self.replay(reply, case)[1]

    def trl_environment(self) -> type:
        """The class TRL's ``environment_factory`` instantiates (one per rollout): each of
        the environment's tools is a method with the tool's signature and docstring."""
        return tool_desk_class(f"verifiers environment {self.env_id!r}", self.vf_env.tool_map,
                               self.vf_env.error_formatter)
