"""The HTTP face of the primitives engine (on ``posttrain.http_core``).

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

Next to them, on the same engine: OpenAI's ``/v1/chat/completions`` and ``/v1/models``
(``posttrain.service.chat``) and, when the ``tinker`` package is installed, the tinker SDK's
wire protocol under ``/api/v1/`` (``posttrain.service.tinker_wire``).

The server binds 127.0.0.1 unless told otherwise and refuses to bind anywhere else
without a token; with a token every request needs ``Authorization: Bearer <token>``.
Bodies over the published ``max_body_bytes`` are refused (413) before they are read.
Whatever a request holds, the answer is a 4xx with a message or a result: an unexpected
exception is a bug, answered 500 with its message, and the server keeps serving.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.http_core import (
    READ_TIMEOUT_SECONDS,
    HttpError,
    HttpServer,
    Request,
    Response,
    Rules,
    json_response,
)
from posttrain.http_core import check_bind as check_core_bind
from posttrain.interrupts import interruptible
from posttrain.service.chat import ChatModels, complete
from posttrain.service.engine import PRIMITIVES, Engine
from posttrain.service.errors import BadRequest, NotFound, ServiceError
from posttrain.service.requests import Limits
from posttrain.service.tinker_wire import TinkerService

PREFIX = "/v1/training"
ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def default_state_dir() -> Path:
    """``~/.cache/posttrain/service`` (read at call time)."""
    return Path.home() / ".cache/posttrain/service"


def service_call(call: Callable[[Request], tuple[int, Any]]) -> Callable[[Request], Response]:
    """A route handler from ``call(request) -> (status, payload)``; the engine's errors
    become the core's error envelope."""

    def handle(request: Request) -> Response:
        for name, value in request.match.items():
            if not ID.match(value) and name != "primitive":
                raise HttpError(404, f"no {name.replace('_', ' ')} {value!r}")
        try:
            status, payload = call(request)
        except ServiceError as error:
            raise HttpError(error.status, error.message) from None
        return json_response(payload, status)

    return handle


def body_of(request: Request) -> Any:
    """The JSON body (an empty body is ``{}``), or ``BadRequest``."""
    try:
        return request.json(empty={})
    except HttpError as error:
        raise BadRequest(error.message.replace("request body", "body")) from None


def service_routes(engine: Engine) -> list[tuple[str, str, Callable[[Request], Response]]]:
    """(method, path, handler) of every endpoint."""

    def ok(payload: Any) -> tuple[int, Any]:
        return 200, payload

    def submit(request: Request) -> tuple[int, Any]:
        primitive = request.match["primitive"]
        if primitive not in PRIMITIVES:
            raise NotFound(f"no primitive {primitive!r}; the primitives are "
                           f"{', '.join(PRIMITIVES)}")
        operation, created = engine.submit(request.match["run_id"], primitive, body_of(request))
        return (202 if created else 200), operation

    def poll(request: Request) -> tuple[int, Any]:
        raw = request.param("wait", "0") or "0"
        try:
            wait = float(raw)
        except ValueError:
            raise BadRequest(f"wait: expected seconds, got {raw!r}") from None
        if not 0 <= wait < float("inf"):
            raise BadRequest(f"wait: expected seconds >= 0, got {raw!r}")
        return ok(engine.get_operation(request.match["operation_id"], wait))

    table: list[tuple[str, str, Callable[[Request], tuple[int, Any]]]] = [
        ("GET", "/health", lambda r: ok({"status": "ok"})),
        ("GET", "/capabilities", lambda r: ok(engine.capabilities())),
        ("POST", "/tokenize", lambda r: ok(engine.tokenize(body_of(r)))),
        ("POST", "/detokenize", lambda r: ok(engine.detokenize(body_of(r)))),
        ("POST", "/sessions", lambda r: ok(engine.create_session(body_of(r)))),
        ("GET", "/sessions/{session_id}", lambda r: ok(engine.get_session(r.match["session_id"]))),
        ("POST", "/sessions/{session_id}/heartbeat",
         lambda r: ok(engine.heartbeat(r.match["session_id"]))),
        ("POST", "/sessions/{session_id}/close",
         lambda r: ok(engine.close_session(r.match["session_id"]))),
        ("POST", "/runs", lambda r: ok(engine.create_run(body_of(r)))),
        ("GET", "/runs/{run_id}", lambda r: ok(engine.get_run(r.match["run_id"]))),
        ("POST", "/runs/{run_id}/cancel", lambda r: ok(engine.cancel_run(r.match["run_id"]))),
        ("POST", "/runs/{run_id}/resume",
         lambda r: ok(engine.resume_run(r.match["run_id"], body_of(r)))),
        ("POST", "/runs/{run_id}/{primitive}", submit),
        ("GET", "/operations/{operation_id}", poll),
    ]
    return [(method, PREFIX + path, service_call(call)) for method, path, call in table]


def openai_routes(engine: Engine) -> list[tuple[str, str, Callable[[Request], Response]]]:
    """``/v1/models`` and ``/v1/chat/completions`` (``posttrain.service.chat``)."""
    models = ChatModels(engine)

    def answer(call: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:
            try:
                return json_response(call(request))
            except ServiceError as error:
                raise HttpError(error.status, error.message) from None
        return handle

    def one_model(request: Request) -> Any:
        name = request.match["model"]
        for entry in models.list():
            if entry["id"] == name:
                return entry
        raise NotFound(f"no model {name!r} here; GET /v1/models lists them")

    return [
        ("GET", "/v1/models", answer(lambda r: {"object": "list", "data": models.list()})),
        ("GET", "/v1/models/{model:path}", answer(one_model)),
        ("POST", "/v1/chat/completions", answer(lambda r: complete(engine, models, body_of(r)))),
    ]


def tinker_available() -> bool:
    """Can the tinker routes run here? They need the ``tinker`` package (its protobuf
    schema): ``pip install 'posttrain[tinker]'``."""
    try:
        import tinker.proto.tinker_public_pb2  # noqa: F401
    except Exception:  # not installed, or an install that does not import
        return False
    return True


def tinker_routes(engine: Engine) -> list[tuple[str, str, Callable[[Request], Response]]]:
    """The tinker SDK's wire protocol, ``/api/v1/...`` (``posttrain.service.tinker_wire``)."""
    return TinkerService(engine).routes()


class RunningServer:
    """A server on a background thread: ``url``, ``port``, ``engine``, ``stop()``."""

    def __init__(self, server: HttpServer, engine: Engine):
        self._server = server
        self.engine = engine
        self.port = server.port
        self.url = server.url
        server.start()

    @property
    def http(self) -> HttpServer:
        """The HTTP server itself (to add routes to)."""
        return self._server

    def stop(self, *, shutdown_engine: bool = True) -> None:
        """Stop answering; with ``shutdown_engine`` also stop the engine's workers."""
        self._server.shutdown()
        self._server.server_close()
        if shutdown_engine:
            self.engine.shutdown()


def check_bind(host: str, token: str | None) -> None:
    """Refuse to bind beyond loopback without a token (anyone could train on the box)."""
    check_core_bind(host, token, "the service")


def start_server(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 8400,
    token: str | None = None,
    *,
    verbose: bool = False,
    read_timeout_s: float = READ_TIMEOUT_SECONDS,
) -> RunningServer:
    """Serve ``engine`` on a background thread (port 0 picks a free port). A client that
    stalls for ``read_timeout_s`` inside its request is dropped."""
    check_bind(host, token)
    server = HttpServer(host, port, Rules(token=token or None,
                                          max_body_bytes=engine.limits.max_body_bytes,
                                          read_timeout_s=read_timeout_s,
                                          name="posttrain serve", verbose=verbose))
    routes = [*service_routes(engine), *openai_routes(engine)]
    if tinker_available():
        routes += tinker_routes(engine)
    for method, path, handler in routes:
        server.add_route(method, path, handler)
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
    print(f"  OpenAI-compatible route: {running.url}/v1 (model {base_model!r}; docs/service.md, "
          "'Use it as an OpenAI endpoint')", flush=True)
    if tinker_available():
        key = "<the --token, which must start with tml->" if token else "tml-local"
        print(f"  tinker SDK route: TINKER_BASE_URL={running.url} TINKER_API_KEY={key} "
              "(docs/service.md, 'Use it with the tinker SDK')", flush=True)
    else:
        print("  the tinker SDK route is off: pip install 'posttrain[tinker]' turns it on",
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
