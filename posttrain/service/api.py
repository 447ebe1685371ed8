"""The HTTP face of the primitives engine (standard library only).

Endpoints (JSON in, JSON out; errors are ``{"error": {"status", "message"}}``)::

    GET  /v1/training/health
    GET  /v1/training/capabilities
    POST /v1/training/tokenize                  {"messages": [...]} | {"text": ...}
    POST /v1/training/detokenize                {"token_ids": [...]}
    POST /v1/training/sessions                  {"heartbeat_timeout_s"?}
    GET  /v1/training/sessions/<id>
    POST /v1/training/sessions/<id>/heartbeat
    POST /v1/training/sessions/<id>/close
    POST /v1/training/runs                      {"session_id", "rank", "alpha",
                                                 "target_modules", "seed"}
    GET  /v1/training/runs/<id>
    POST /v1/training/runs/<id>/cancel
    POST /v1/training/runs/<id>/resume          {"session_id"}
    POST /v1/training/runs/<id>/<primitive>     {"seq"?, ...}: 202 + operation (200 on a retry)
    GET  /v1/training/operations/<id>?wait=<s>  long-poll until the operation ends (or wait s)

The server binds 127.0.0.1 unless told otherwise and refuses to bind anywhere else
without a token; with a token every request needs ``Authorization: Bearer <token>``.
Bodies over the published ``max_body_bytes`` are refused (413) before they are read.
Whatever a request holds, the answer is a 4xx with a message or a result: an unexpected
exception is a bug, answered 500 with its message, and the server keeps serving.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from posttrain.errors import PosttrainError
from posttrain.http_guard import foreign_request
from posttrain.interrupts import interruptible
from posttrain.jsonl import strict_json_loads
from posttrain.service.engine import PRIMITIVES, Engine
from posttrain.service.errors import (
    BadRequest,
    NotFound,
    ServiceError,
    TooLarge,
    Unauthorized,
)
from posttrain.service.requests import Limits

PREFIX = "/v1/training"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
ID = r"([A-Za-z0-9_-]{1,64})"
DISCARD_LIMIT = 64 << 20  # a refused body up to this size is read and dropped


def default_state_dir() -> Path:
    """``~/.cache/posttrain/service`` (read at call time)."""
    return Path.home() / ".cache/posttrain/service"


def _routes(engine: Engine) -> list[tuple[str, re.Pattern, Any]]:
    """(method, path pattern, handler(match, body, query) -> (status, payload))."""

    def ok(payload: Any) -> tuple[int, Any]:
        return 200, payload

    def submit(match: re.Match, body: Any, query: dict) -> tuple[int, Any]:
        operation, created = engine.submit(match[1], match[2], body)
        return (202 if created else 200), operation

    def poll(match: re.Match, body: Any, query: dict) -> tuple[int, Any]:
        raw = query.get("wait", ["0"])[0]
        try:
            wait = float(raw)
        except ValueError:
            raise BadRequest(f"wait: expected seconds, got {raw!r}") from None
        if not 0 <= wait < float("inf"):
            raise BadRequest(f"wait: expected seconds >= 0, got {raw!r}")
        return ok(engine.get_operation(match[1], wait))

    primitives = "|".join(PRIMITIVES)
    table = [
        ("GET", "/health", lambda m, b, q: ok({"status": "ok"})),
        ("GET", "/capabilities", lambda m, b, q: ok(engine.capabilities())),
        ("POST", "/tokenize", lambda m, b, q: ok(engine.tokenize(b))),
        ("POST", "/detokenize", lambda m, b, q: ok(engine.detokenize(b))),
        ("POST", "/sessions", lambda m, b, q: ok(engine.create_session(b))),
        ("GET", f"/sessions/{ID}", lambda m, b, q: ok(engine.get_session(m[1]))),
        ("POST", f"/sessions/{ID}/heartbeat", lambda m, b, q: ok(engine.heartbeat(m[1]))),
        ("POST", f"/sessions/{ID}/close", lambda m, b, q: ok(engine.close_session(m[1]))),
        ("POST", "/runs", lambda m, b, q: ok(engine.create_run(b))),
        ("GET", f"/runs/{ID}", lambda m, b, q: ok(engine.get_run(m[1]))),
        ("POST", f"/runs/{ID}/cancel", lambda m, b, q: ok(engine.cancel_run(m[1]))),
        ("POST", f"/runs/{ID}/resume", lambda m, b, q: ok(engine.resume_run(m[1], b))),
        ("POST", f"/runs/{ID}/({primitives})", submit),
        ("GET", f"/operations/{ID}", poll),
    ]
    return [(method, re.compile(f"^{PREFIX}{path}$"), handler) for method, path, handler in table]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds a client may stall mid-request before its connection is dropped
    server: _Server

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _handle(self, method: str) -> None:
        try:
            self._refuse_foreign(method)
            self._check_token()
            body = self._read_body() if method == "POST" else None
            status, payload = self._dispatch(method, body)
        except (TimeoutError, ConnectionError):  # the client stalled or left mid-body
            self.close_connection = True
            return
        except ServiceError as error:
            status, payload = error.status, {"error": {"status": error.status,
                                                       "message": error.message}}
        except Exception as error:  # a bug: answer it, log it, keep serving
            traceback.print_exc(file=sys.stderr)
            status, payload = 500, {"error": {"status": 500,
                                              "message": f"internal error: {error!r}"}}
        self._send(status, payload)

    def _refuse_foreign(self, method: str) -> None:
        """A request a web page could have forged (``posttrain.http_guard``) is refused
        before its body is read."""
        bound, port = self.server.server_address[:2]
        refusal = foreign_request(method, self.headers, str(bound), int(port))
        if refusal is not None:
            self.close_connection = True
            raise ServiceError(refusal[1], refusal[0])

    def _check_token(self) -> None:
        token = self.server.token
        if token is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self.close_connection = True  # the body (if any) stays unread
            raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <token>'")

    def _read_body(self) -> Any:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ServiceError("send the body with a Content-Length, not chunked", 411)
        raw_length = self.headers.get("Content-Length", "0")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise BadRequest(f"Content-Length: not a number: {raw_length!r}") from None
        if length < 0:
            self.close_connection = True
            raise BadRequest("Content-Length: negative")
        limit = self.server.engine.limits.max_body_bytes
        if length > limit:
            self.close_connection = True
            self._discard(length)
            raise TooLarge(f"body of {length} bytes is over the limit of {limit} bytes")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            return strict_json_loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise BadRequest(f"body is not valid JSON: {error}") from None
        except RecursionError:
            raise BadRequest("body is nested too deeply") from None

    def _discard(self, length: int) -> None:
        """Read and drop a refused body (up to ``DISCARD_LIMIT``) so the client, still
        sending, gets the 413 instead of a reset connection; past that, just hang up."""
        left = length if length <= DISCARD_LIMIT else 0
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)

    def _dispatch(self, method: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        known_path = False
        for route_method, pattern, handler in self.server.routes:
            match = pattern.match(parts.path)
            if match is None:
                continue
            known_path = True
            if route_method == method:
                return handler(match, body, query)
        if known_path:
            raise ServiceError(f"{method} is not allowed on {parts.path}", 405)
        raise NotFound(f"no endpoint {method} {parts.path}; see GET {PREFIX}/capabilities")

    def _send(self, status: int, payload: Any) -> None:
        try:
            data = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        except ValueError:  # a NaN or infinity somewhere: JSON has no such numbers
            data = json.dumps(_finite(payload), separators=(",", ":")).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], engine: Engine, token: str | None,
                 verbose: bool):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.engine, self.token, self.verbose = engine, token, verbose
        self.routes = _routes(engine)


class RunningServer:
    """A server on a background thread: ``url``, ``port``, ``engine``, ``stop()``."""

    def __init__(self, server: _Server, engine: Engine):
        self._server = server
        self.engine = engine
        host, port = server.server_address[:2]
        self.port = port
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        self._thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self, *, shutdown_engine: bool = True) -> None:
        """Stop answering; with ``shutdown_engine`` also stop the engine's workers."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        if shutdown_engine:
            self.engine.shutdown()


def check_bind(host: str, token: str | None) -> None:
    """Refuse to bind beyond loopback without a token (anyone could train on the box)."""
    if host not in LOOPBACK_HOSTS and not token:
        raise PosttrainError(
            f"binding {host} exposes the service beyond this machine; pass --token <secret> "
            "(clients then send 'Authorization: Bearer <secret>') or bind 127.0.0.1"
        )


def start_server(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 8400,
    token: str | None = None,
    *,
    verbose: bool = False,
) -> RunningServer:
    """Serve ``engine`` on a background thread (port 0 picks a free port)."""
    check_bind(host, token)
    try:
        server = _Server((host, port), engine, token, verbose)
    except OSError as error:
        raise PosttrainError(f"cannot listen on {host}:{port}: {error}") from error
    return RunningServer(server, engine)


def serve(
    base_model: str,
    host: str = "127.0.0.1",
    port: int = 8400,
    token: str | None = None,
    state_dir: str | Path | None = None,
    *,
    verbose: bool = True,
    torch_threads: int | None = None,
    limits: Limits | None = None,
) -> None:
    """Load ``base_model`` and serve the primitives until Ctrl-C (blocking)."""
    check_bind(host, token)
    engine = Engine(base_model, state_dir or default_state_dir(), torch_threads=torch_threads,
                    limits=limits)
    running = start_server(engine, host, port, token, verbose=verbose)
    dormant = [r for r in engine_runs(engine) if r["status"] == "dormant"]
    print(f"posttrain serve: {base_model} on {running.url}{PREFIX} (state in {engine.state_dir})",
          flush=True)
    if dormant:
        print(f"  {len(dormant)} dormant run(s) can be resumed: "
              + ", ".join(r["run_id"] for r in dormant), flush=True)
    try:
        with interruptible():  # Ctrl-C and SIGTERM, even when started with SIGINT ignored
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


def engine_runs(engine: Engine) -> list[dict[str, Any]]:
    """Every run the engine knows (for the start-up banner)."""
    return [engine.get_run(run_id) for run_id in engine.run_ids()]
