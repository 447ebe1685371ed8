"""Small OpenAI-compatible chat servers of the tests' own (real HTTP on 127.0.0.1): a
base handler that lists one model and sends JSON, a chat-completion answer builder, and a
context manager that serves a handler and yields its API base URL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
