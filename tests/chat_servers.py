"""Small OpenAI-compatible chat servers of the tests' own (real HTTP on 127.0.0.1): a
base handler that lists one model and sends JSON, a chat-completion answer builder, and a
context manager that serves a handler and yields its API base URL; and servers that
misbehave (``MISBEHAVIOURS``: wrong statuses, bodies that are not JSON, JSON of the wrong
shape, truncated, huge, slow and hung-up answers) for the clients' error tests."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ChatHandler(BaseHTTPRequestHandler):
    """Lists ``model`` on GET; subclasses answer POSTs (``body()`` reads the request)."""

    model = "scripted"

    def do_GET(self) -> None:
        self.send_json({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def body(self) -> dict[str, Any]:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_json(self, payload: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def completion(model: str, content: str | None = None,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A one-choice chat completion answering with ``content`` and/or ``tool_calls``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": "x", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@contextmanager
def serving(handler: type[ChatHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free port; yields ``http://127.0.0.1:<port>/v1``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


# --- servers that misbehave --------------------------------------------------------------

@dataclass(frozen=True)
class Misbehaviour:
    """One wrong answer: ``status`` with ``body`` (bytes, sent as ``content_type``), or a
    delivery fault: ``delay_s`` before answering, ``truncate`` (a ``Content-Length``
    promising more than is sent, then the connection closes), ``hang_up`` (the
    connection closes with no answer at all) or ``raw`` (``body`` is all that is sent: no
    status line, no headers, not HTTP)."""

    name: str
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0
    truncate: bool = False
    hang_up: bool = False
    raw: bool = False


def json_body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def _choice_with(message: Any) -> bytes:
    return json_body({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                      "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


#: the catalogue every client is held to (issue #32): a wrong status, a body that is not
#: JSON, JSON of the wrong shape, and faults of delivery
MISBEHAVIOURS = [
    Misbehaviour("500", 500, b"Internal Server Error: the GPU caught fire", "text/plain"),
    Misbehaviour("404 html", 404, b"<html><body>no such page</body></html>", "text/html"),
    Misbehaviour("302 away", 302, b"", "text/plain", headers=(("Location", "/elsewhere"),)),
    Misbehaviour("200 html", 200, b"<!doctype html><html><body>Sign in</body></html>",
                 "text/html"),
    Misbehaviour("not json", 200, b"this is not json {", "application/json"),
    Misbehaviour("json list", 200, json_body([1, 2, 3])),
    Misbehaviour("json null", 200, b"null"),
    Misbehaviour("json string", 200, json_body("hello")),
    Misbehaviour("no choices key", 200, json_body({"id": "x", "object": "chat.completion"})),
    Misbehaviour("choices empty", 200, json_body({"id": "x", "choices": []})),
    Misbehaviour("choices a string", 200, json_body({"id": "x", "choices": "PASS"})),
    Misbehaviour("choice not an object", 200, json_body({"id": "x", "choices": [7]})),
    Misbehaviour("message null", 200, _choice_with(None)),
    Misbehaviour("content a number", 200, _choice_with({"role": "assistant", "content": 42})),
    Misbehaviour("content a list", 200, _choice_with({"role": "assistant",
                                                      "content": [{"x": 1}]})),
    Misbehaviour("tool call name a number", 200, _choice_with({
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": 5, "arguments": 7}}]})),
    Misbehaviour("tool calls a string", 200, _choice_with({
        "role": "assistant", "content": "x", "tool_calls": "oops"})),
    Misbehaviour("huge not json", 200, b"<" * 8_000_000, "text/html"),
    Misbehaviour("truncated", 200, json_body({"id": "x", "choices": [{"index": 0}]}),
                 truncate=True),
    Misbehaviour("hang up", hang_up=True),
    Misbehaviour("not http", body=b"SSH-2.0-OpenSSH_9.6\r\n\r\n", raw=True),
]
#: an answer slower than the clients' timeout in these tests (they use timeouts of ~1 s)
SLOW = Misbehaviour("slow", 200, _choice_with({"role": "assistant", "content": "late"}),
                    delay_s=3.0)


def send_misbehaviour(handler: BaseHTTPRequestHandler, answer: Misbehaviour) -> None:
    """Answer the request ``handler`` is serving with ``answer`` (its body is read first,
    so the client is never cut off mid-send)."""
    length = int(handler.headers.get("Content-Length") or 0)
    if length:
        handler.rfile.read(length)
    if answer.delay_s:
        time.sleep(answer.delay_s)
    handler.close_connection = answer.hang_up or answer.truncate or answer.raw
    try:
        if not answer.hang_up:
            _send(handler, answer)
        if handler.close_connection:
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the client gave up first (a timeout, a refused redirect): nothing to tell


def _send(handler: BaseHTTPRequestHandler, answer: Misbehaviour) -> None:
    if answer.raw:
        handler.wfile.write(answer.body)
        return
    handler.send_response(answer.status)
    handler.send_header("Content-Type", answer.content_type)
    promised = len(answer.body) * 2 + 10 if answer.truncate else len(answer.body)
    handler.send_header("Content-Length", str(promised))
    for name, value in answer.headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(answer.body)


def misbehaving(answer: Misbehaviour, *, on_get: bool = False) -> type[ChatHandler]:
    """A chat handler answering every POST (and every GET too when ``on_get``: the model
    listing) with ``answer``; otherwise it lists its one model."""

    class Misbehaving(ChatHandler):
        def do_GET(self) -> None:
            if on_get:
                send_misbehaviour(self, answer)
            else:
                super().do_GET()

        def do_POST(self) -> None:
            send_misbehaviour(self, answer)

    return Misbehaving
