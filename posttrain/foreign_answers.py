"""What another server answered, read with suspicion (issue #32).

A chat endpoint, a judge, a prompt writer or a run server is input like any file: it can
answer HTML from a proxy, a truncated or huge body, JSON of another shape. Its clients
read answers through here, so a wrong one stops with one line that names the server and
quotes what it sent, bounded (``quoted``), never with an ``AttributeError`` from deep
inside a client library.

- ``quoted``: the start of an answer as one line (control characters escaped);
- ``chat_reply``: the text of a chat completion's first choice, tool calls as
  ``<tool_call>`` blocks (the wire format every environment grades);
- ``model_ids``: the ids of a ``GET /models`` listing.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.errors import PosttrainError

#: how much of a wrong answer an error line quotes
QUOTE_CHARS = 200


def quoted(text: str | bytes, limit: int = QUOTE_CHARS) -> str:
    """The first ``limit`` characters of ``text`` as a Python string literal (so newlines
    and control characters cannot break the line), followed by the full length when cut.
    Bytes are decoded as UTF-8 with replacement characters; an empty answer reads
    ``an empty body``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text:
        return "an empty body"
    # repr escapes every character that could end the line (\n, \r, \x85, \u2028, ...)
    shown = repr(text[:limit])
    if len(text) <= limit:
        return shown
    return f"{shown} (first {limit} of {len(text)} characters)"


def _kind(value: Any) -> str:
    """A JSON value's kind, for messages (``null``, ``a number``, ``a list``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _json(body: str, where: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise PosttrainError(f"{where} answered a body that is not JSON: {quoted(body)}"
                             ) from None


def _wrong(where: str, what: str, why: str, body: str) -> PosttrainError:
    return PosttrainError(f"{where} answered JSON that is not {what} ({why}): "
                          f"{quoted(body)}")


def chat_reply(body: str, where: str) -> str:
    """The reply in a chat completion's ``body``: ``choices[0].message.content`` (null
    reads as empty), then each of its ``tool_calls`` as a ``<tool_call>`` block whose
    arguments are the decoded JSON (kept as sent when they do not decode: the rule
    grades that call malformed).

    Raises ``PosttrainError`` starting with ``where`` (the flag and URL that named the
    server) and quoting the body when it is not JSON or not a chat completion."""
    payload = _json(body, where)
    what = "a chat completion"
    if not isinstance(payload, dict):
        raise _wrong(where, what, f"it is {_kind(payload)}", body)
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        why = ("no 'choices'" if choices is None or choices == []
               else f"'choices' is {_kind(choices)}")
        raise _wrong(where, what, why, body)
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise _wrong(where, what, "choices[0] has no 'message' object", body)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _wrong(where, what, f"the message's content is {_kind(content)}, not text",
                     body)
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise _wrong(where, what, f"the message's tool_calls is {_kind(calls)}", body)
    text = content or ""
    for index, call in enumerate(calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _wrong(where, what, f"tool_calls[{index}] has no function name", body)
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                pass  # kept as sent: the rule grades it malformed
        elif arguments is None:
            arguments = {}
        block = json.dumps({"name": name, "arguments": arguments})
        text += ("\n" if text else "") + f"<tool_call>\n{block}\n</tool_call>"
    return text


def model_ids(body: str, where: str) -> list[str]:
    """The model ids of a ``GET /models`` answer (``{"data": [{"id": ...}, ...]}``).

    Raises ``PosttrainError`` starting with ``where`` and quoting the body when it is
    not JSON or not such a listing."""
    payload = _json(body, where)
    what = "a model listing"
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise _wrong(where, what, "no 'data' list", body)
    ids = [entry.get("id") if isinstance(entry, dict) else None for entry in data]
    if not all(isinstance(model_id, str) for model_id in ids):
        raise _wrong(where, what, "an entry without a string 'id'", body)
    return [str(model_id) for model_id in ids]
