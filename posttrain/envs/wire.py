"""The tool-call wire format every built-in policy speaks, whatever the rule.

A tool call is one block in the reply::

    <tool_call>
    {"name": "<tool name>", "arguments": {...}}
    </tool_call>

(Qwen2.5's format, and the starter's). Environments read calls with
``parse_tool_call``; constructed negatives and scripted agents write them with
``render_tool_call``.

A multi-turn episode's policy turns travel as one text, joined by ``TURN_SEPARATOR``
(``join_turns``/``split_turns``): that is a graded row's ``reply``, so every statistic
and scan that reads replies reads episodes too.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
#: the system prompt's instruction for the format (the refund rules' and the ecosystem
#: tool environments' prompts end with it)
WIRE_FORMAT = (
    "To call a tool, reply with exactly one block:\n"
    "<tool_call>\n"
    '{"name": "<tool name>", "arguments": {...}}\n'
    "</tool_call>\n"
    "Otherwise reply in plain text."
)
TOOL_CALL_CLOSE = "</tool_call>"
#: what separates the policy's turns in an episode's ``reply``: the chat end-of-turn
#: text, which a sampled turn never holds (a special token, stripped from the text)
TURN_SEPARATOR = "\n<|im_end|>\n"


def render_tool_call(name: str, arguments: dict[str, Any], *, canonical: bool = False) -> str:
    """A ``<tool_call>`` block; ``canonical`` sorts the JSON keys (for comparisons)."""
    payload = json.dumps({"name": name, "arguments": arguments}, sort_keys=canonical)
    return f"<tool_call>\n{payload}\n</tool_call>"


def tool_call_blocks(text: str, *, first_only: bool = False) -> list[str]:
    """The body of every complete ``<tool_call>`` block of ``text``, in order: from each
    opening to the first closing after it, then on after that closing (what the pattern
    ``<tool_call>(.*?)</tool_call>`` finds). Linear in the text: a regular expression
    tries every opening against the rest of the text, so a reply of many unclosed
    openings cost it quadratic time (100,000 characters: 24 s); here an opening with no
    closing after it ends the search, as no later opening can have one either."""
    blocks: list[str] = []
    start = 0
    while True:
        opened = text.find(TOOL_CALL_OPEN, start)
        if opened < 0:
            return blocks
        body = opened + len(TOOL_CALL_OPEN)
        closed = text.find(TOOL_CALL_CLOSE, body)
        if closed < 0:
            return blocks
        blocks.append(text[body:closed])
        if first_only:
            return blocks
        start = closed + len(TOOL_CALL_CLOSE)


def parse_tool_call(text: str) -> dict[str, Any] | None:
    """The first ``<tool_call>`` block of ``text`` as ``{"name", "arguments"}``, or None.

    Whitespace around the JSON is tolerated. The name is read from ``name`` (or
    ``tool``) and must be a non-empty string; arguments from ``arguments`` (or
    ``args``), decoded when given as a JSON string, ``{}`` when not an object.
    Malformed JSON or a missing name is "no valid call": None, never an exception.
    """
    blocks = tool_call_blocks(text or "", first_only=True)
    if not blocks:
        return None
    try:
        payload = json.loads(blocks[0].strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name", payload.get("tool"))
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = payload.get("arguments", payload.get("args", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    return {"name": name.strip(), "arguments": arguments}


def parse_tool_calls(text: str) -> list[dict[str, Any]] | None:
    """Every ``<tool_call>`` block of ``text`` in order (``[]`` for plain prose); None
    when a block is opened and not closed, or does not parse."""
    text = text or ""
    blocks = tool_call_blocks(text)
    if text.count(TOOL_CALL_OPEN) != len(blocks):
        return None
    calls = []
    for block in blocks:
        call = parse_tool_call(f"{TOOL_CALL_OPEN}{block}{TOOL_CALL_CLOSE}")
        if call is None:
            return None
        calls.append(call)
    return calls


def join_turns(turns: list[str]) -> str:
    """An episode's policy turns as one ``reply`` text."""
    return TURN_SEPARATOR.join(turns)


def split_turns(reply: str) -> list[str]:
    """An episode's ``reply`` back into the policy's turns."""
    return (reply or "").split(TURN_SEPARATOR)

