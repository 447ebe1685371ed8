"""An inspect_ai task with tools (``use_tools``) as a posttrain multi-turn environment.

inspect's ``generate`` loops while the model calls tools: each call runs the tool's
``execute`` function and its result goes back as a tool message; a turn without calls is
the model's output. posttrain plays the same episode:

- the policy sees the task's system prompt, the tools (one JSON schema a line, from
  inspect's ``ToolDef``) and posttrain's ``<tool_call>`` wire format; an endpoint gets
  them as OpenAI tools;
- the desk (``tool_desk.ToolDesk``) runs the task's own tool functions; a failure goes
  back as its message;
- the scorers see what inspect's would: the prompt, the assistant turns with their
  ``ToolCall``s, the tool messages (the calls replayed on fresh tools, never read from the
  text), and the last turn as the model's output;
- TRL's GRPO plays the tools through a class made from their signatures and docstrings.

Only tools defined by the task's package or file: inspect's own (``bash``, ``python``,
``text_editor``, web and computer tools) need a sandbox or the network and are refused.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.envs.base import Case, Messages
from posttrain.envs.ecosystem.inspect_env import (
    POLICY_MODEL,
    InspectEnv,
    _registry_name,
    _short_name,
    _solvers,
)
from posttrain.envs.ecosystem.spec import JudgeEndpoint
from posttrain.envs.ecosystem.tool_desk import (
    ToolDesk,
    tool_desk_class,
    turn_text,
    with_system,
)
from posttrain.envs.wire import WIRE_FORMAT, parse_tool_calls, split_turns
from posttrain.errors import PosttrainError

#: turns an episode may take when the task sets no message limit
DEFAULT_MAX_TURNS = 10


def uses_tools(task: Any) -> bool:
    """Does the task's solver chain give the model tools with ``use_tools``?"""
    return any(_short_name(_registry_name(solver)) == "use_tools"
               for solver in _solvers(task.solver))


class InspectToolEnv(InspectEnv):
    """An inspect task with ``use_tools`` behind posttrain's multi-turn contract (module
    docstring)."""

    multi_turn = True

    def __init__(self, target: str, args: dict[str, Any] | None, task: Any,
                 judge: JudgeEndpoint | None = None) -> None:
        from inspect_ai.tool import ToolDef

        super().__init__(target, args, task, judge)
        where = f"inspect task {target!r}"
        seen = {tuple(ToolDef(tool).name for tool in tools) for tools in self._tools_seen}
        if len(seen) != 1 or not next(iter(seen)):
            raise PosttrainError(f"{where}: its samples get different tools (or none); "
                                 "posttrain plays one tool set for every prompt")
        tools = self._tools_seen[0]
        built_in = [_registry_name(tool) for tool in tools
                    if _registry_name(tool).startswith("inspect_ai/")]
        if built_in:
            raise PosttrainError(f"{where}: tool(s) {', '.join(built_in)} need a sandbox or "
                                 "the network, which posttrain does not provide; plain Python "
                                 "tools of the task's own are played")
        definitions = [ToolDef(tool) for tool in tools]
        self._tool_map = {definition.name: tool for definition, tool in zip(definitions, tools,
                                                                             strict=True)}
        self.tools = [{"type": "function",
                       "function": {"name": d.name, "description": d.description,
                                    "parameters": d.parameters.model_dump(exclude_none=True)}}
                      for d in definitions]
        listed = "\n".join(json.dumps(tool["function"], separators=(",", ":"))
                           for tool in self.tools)
        self._task_system = self.system
        self.system = (f"{self.system}\n\n" if self.system else "") + \
            f"Tools:\n{listed}\n\n{WIRE_FORMAT}"
        limit = task.message_limit
        self.max_turns = max(1, limit // 2) if limit else DEFAULT_MAX_TURNS
        self._probe_scorers()

    def messages_for(self, prompt: str) -> Messages:
        return with_system(InspectEnv.messages_for(self, prompt), self.system)

    def new_desk(self, case: Case) -> ToolDesk:
        """A fresh episode: the task's tools, nothing called yet."""
        return ToolDesk(dict(self._tool_map))

    def replay(self, reply: str, case: Case) -> tuple[list[Any], str, dict[str, Any]]:
        """The policy's turns as inspect's messages (the calls run on fresh tools), the
        final turn's text, and the episode's counts."""
        from inspect_ai.model import ChatMessageAssistant, ChatMessageTool
        from inspect_ai.tool import ToolCall

        desk = self.new_desk(case)
        messages: list[Any] = []
        final = ""
        summary: dict[str, Any] = {"turns": 0, "tool_calls": 0, "failed_calls": 0,
                                   "ended": "turn_limit"}
        for index, turn in enumerate(split_turns(reply)[: self.max_turns]):
            summary["turns"] += 1
            calls = parse_tool_calls(turn)
            if not calls:  # prose, or a broken block: the model's output
                messages.append(ChatMessageAssistant(content=turn, model=POLICY_MODEL))
                final, summary["ended"] = turn, "reply"
                break
            tool_calls = [ToolCall(id=f"call_{index}_{number}", function=call["name"],
                                   arguments=dict(call["arguments"]))
                          for number, call in enumerate(calls)]
            messages.append(ChatMessageAssistant(content=turn_text(turn),
                                                 tool_calls=tool_calls, model=POLICY_MODEL))
            for tool_call, call in zip(tool_calls, calls, strict=True):
                result = desk.call(call["name"], call["arguments"])
                messages.append(ChatMessageTool(content=result, tool_call_id=tool_call.id,
                                                function=call["name"]))
        summary["tool_calls"] = len(desk.calls)
        summary["failed_calls"] = sum(not ok for *_, ok in desk.calls)
        return messages, final, summary

    def conversation(self, reply: str, case: Case) -> tuple[list[Any], str]:
        """The task's own prompt (its system prompt without posttrain's tool list), then the
        replayed episode; the final turn is the model's output."""
        prompt = InspectEnv.messages_for(self, case["prompt"])
        completion, final, _ = self.replay(reply, case)
        return [*self._chat(prompt), *completion], final

    def episode_summary(self, reply: str, case: Case) -> dict[str, Any]:
        """Turns, tool calls, failed calls and how the episode ended."""
        return self.replay(reply, case)[2]

    def trl_environment(self) -> type:
        """The class TRL's ``environment_factory`` instantiates (one per rollout)."""
        return tool_desk_class(f"inspect task {self.target!r}", self._tool_map)
