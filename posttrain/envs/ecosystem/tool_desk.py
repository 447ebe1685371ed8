"""What the ecosystem's tool environments share: the episode's tools (``ToolDesk``), a
turn's prose without its calls, and the class TRL's GRPO plays the tools through.

A library's tools are plain functions (sync or async); the desk runs them, and a failure
goes back to the policy as text (``error_formatter``), never as a raise.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.ecosystem.bridge import run_sync
from posttrain.envs.wire import TOOL_CALL_OPEN


@dataclass
class ToolDesk:
    """One episode's tools: the environment's functions by name, each failure formatted by
    ``error_formatter`` (a verifiers ToolEnv's own, or ``str``)."""

    tool_map: dict[str, Any]
    error_formatter: Callable[[Exception], Any] = str
    done: bool = False
    calls: list[tuple[str, dict[str, Any], str, bool]] = field(default_factory=list)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's result as text; an unknown tool or a raised error is text too."""
        function = self.tool_map.get(name)
        try:
            if function is None:
                raise KeyError(name)  # what a ToolEnv raises for an unknown tool
            result = function(**arguments)
            if inspect.isawaitable(result):
                result = run_sync(result)
            text, ok = str(result), True
        except Exception as error:  # a tool's own failure goes back to the policy
            text, ok = str(self.error_formatter(error)), False
        self.calls.append((name, dict(arguments), text, ok))
        return text


def with_system(messages: list[dict[str, str]], system: str) -> list[dict[str, str]]:
    """``messages`` with ``system`` as their system message (added first when none):
    a tool environment's prompt lists its tools and the wire format there."""
    for message in messages:
        if message["role"] == "system":
            message["content"] = system
            return messages
    return [{"role": "system", "content": system}, *messages]


def turn_text(turn: str) -> str:
    """A turn's prose without its ``<tool_call>`` blocks (the calls travel as tool_calls)."""
    head = turn.split(TOOL_CALL_OPEN, 1)[0]
    return head.strip()


def tool_desk_class(label: str, tool_map: dict[str, Any],
                    error_formatter: Callable[[Exception], Any] = str) -> type:
    """A TRL environment class for ``tool_map``: ``reset(**row)`` starts an episode, and a
    method per tool (TRL reads each one's schema from its signature and docstring)."""

    def __init__(self: Any) -> None:
        self.desk = ToolDesk(dict(tool_map), error_formatter)

    def reset(self: Any, **row: Any) -> None:
        self.desk = ToolDesk(dict(tool_map), error_formatter)

    namespace: dict[str, Any] = {"__init__": __init__, "reset": reset,
                                 "__doc__": f"The tools of {label}."}
    for name, function in tool_map.items():
        namespace[name] = _tool_method(name, function)
    return type("EcosystemToolDesk", (), namespace)


def _tool_method(name: str, function: Any) -> Any:
    """A method that runs tool ``name`` on the instance's desk, with the function's own
    signature (``self`` first), type hints and docstring."""
    signature = inspect.signature(function)

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        return str(self.desk.call(name, dict(bound.arguments)))

    hints = typing.get_type_hints(function)
    hints["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__doc__ = function.__doc__
    method.__annotations__ = hints
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # inspect.signature reads __signature__ (a function has no such declared attribute)
    vars(method)["__signature__"] = signature.replace(
        parameters=[self_parameter, *signature.parameters.values()], return_annotation=str)
    return method
