"""One HTTP core for posttrain's servers: Starlette on uvicorn.

The run server (and the dashboard on it) and the training service are built on this, so
they answer the same way:

- **Binding**: loopback unless told otherwise; any other address needs a token
  (``check_bind``). A port already taken is a ``PosttrainError`` naming it.
- **Forged browser requests** are refused first (``posttrain.http_guard``).
- **The token** (``Authorization: Bearer <token>``) is checked from the headers, before a
  body is read; a refused request's connection is closed with its body unread.
- **Body limit**: a body whose ``Content-Length`` is over the limit is answered 413 at
  once, and the body is then drained and dropped (up to ``DRAIN_LIMIT``) so a client
  still sending it reads the 413 rather than a reset connection. A chunked body is
  refused (411): send a length. A request with neither has no body (RFC 9112).
- **Stalled clients**: a client that stops mid-body for ``read_timeout_s`` is answered 408
  and dropped; an idle connection is closed by uvicorn after a few seconds.
- **One error envelope** for every refusal, unknown path, wrong method, bad input and bug:
  ``{"error": {"status": <int>, "message": <str>}}``. A bug is answered 500 with its type,
  logged to stderr, and the server keeps serving.
- **JSON out** never holds NaN or Infinity (no browser parses them): they go out as null.
- **WebSockets** pass the same ``Host``/``Origin`` guard (any foreign ``Origin`` refused:
  ``http_guard.foreign_socket``) and the same token before the handshake is accepted; a
  refused one is answered with the status and the envelope, not upgraded. A message is
  at most the body limit, and a socket whose client sends nothing for ``idle_socket_s``
  is closed (1001), which ends whatever session the app held for it.
- **Another framework's app** (OpenEnv's FastAPI app, for ``posttrain env serve``) is
  mounted behind all of this (``HttpServer.mount``): its request body is read whole first
  (a stall is answered 408, a body that is not strict JSON 400, by the core), and its
  errors, its validation refusals and its bugs are answered in the same envelope.

Handlers are plain functions ``handler(Request) -> Response`` run in uvicorn's thread
pool (the stores and the engine are synchronous); paths use Starlette's syntax
(``/api/runs/{name}``), whose parameters arrive in ``request.match``.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from posttrain.access import ADMIN, NOBODY, Caller, identify
from posttrain.errors import PosttrainError
from posttrain.http_guard import foreign_request, foreign_socket, is_loopback
from posttrain.jsonl import describe_cost, parse_cost, strict_json_loads, to_jsonable
from posttrain.text import echo

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
#: the most a JSON body may cost to parse (``jsonl.parse_cost``): a body within the byte
#: limit made of ``{},`` would take ~2 GB; a batch of metrics ~0.4 GB at 32 MB
MAX_BODY_PARSE_COST = 1024**3
DRAIN_LIMIT = 64 * 1024 * 1024  # past this, a refused body is not drained: the client is cut
READ_TIMEOUT_SECONDS = 30.0
IDLE_SOCKET_SECONDS = 300.0
TOKEN_HINT = "send 'Authorization: Bearer <token>' with the server's token (POSTTRAIN_TOKEN)"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# what a numeric query parameter may look like: ASCII decimal, no NaN, no digit separators
PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


class HttpError(Exception):
    """Raise in a handler to answer ``status`` with the error envelope."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """What a handler sees: method, path, the path's parameters, query, headers, body."""

    method: str
    path: str
    match: Mapping[str, str]
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""
    #: who sent it (``posttrain.access``): a tokens file's name, or the administrator
    caller: Caller = ADMIN

    def param(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``, or ``default``."""
        values = self.query.get(name)
        return values[0] if values else default

    def int_param(self, name: str, default: int | None, low: int, high: int) -> int | None:
        """Query parameter ``name`` as a whole number in ``[low, high]`` (``default`` when
        absent or empty); ``HttpError(400)`` naming the parameter otherwise. ``high`` is
        required so that no value reaches SQLite or a loop unbounded (int64 overflows)."""
        raw = self.param(name)
        if raw is None or raw.strip() == "":
            return default
        text = raw.strip()
        if len(text) > 20 or not text.lstrip("+-").isdecimal():  # isdecimal: ASCII and more
            raise HttpError(400, f"query parameter {name!r} must be a whole number, "
                                 f"got {echo(raw)}")
        try:
            value = int(text)
        except ValueError:  # other scripts' digits (isdecimal takes them; int may not)
            raise HttpError(400, f"query parameter {name!r} must be a whole number, "
                                 f"got {echo(raw)}") from None
        if not low <= value <= high:
            raise HttpError(400, f"query parameter {name!r} must be between {low} and "
                                 f"{high}, got {value}")
        return value

    def choice_param(self, name: str, default: str, choices: Sequence[str]) -> str:
        """Query parameter ``name``, one of ``choices``; ``HttpError(400)`` otherwise."""
        value = self.param(name, default) or default
        if value not in choices:
            raise HttpError(400, f"query parameter {name!r} must be one of "
                                 f"{', '.join(choices)}, got {echo(value)}")
        return value

    def number_param(self, name: str, default: float, low: float, high: float) -> float:
        """Query parameter ``name`` as a plain decimal number in ``[low, high]`` (``default``
        when absent or empty); ``HttpError(400)`` naming the parameter otherwise: ``nan``,
        ``inf``, ``1_0`` and other scripts' digits are not numbers here, and a huge one
        (``1e999``) is out of range."""
        raw = self.param(name)
        if raw is None or raw.strip() == "":
            return default
        if not PLAIN_NUMBER.fullmatch(raw.strip()):
            raise HttpError(400, f"query parameter {name!r} must be a number, got {echo(raw)}")
        value = float(raw)
        if not low <= value <= high:
            raise HttpError(400, f"query parameter {name!r} must be between {low:g} and "
                                 f"{high:g}, got {echo(raw)}")
        return value

    def json(self, *, empty: Any = None) -> Any:
        """The body parsed as strict JSON (no NaN, Infinity or 1e400); an empty body gives
        ``empty`` when that is not None. ``HttpError(400)`` otherwise."""
        if empty is not None and not self.body.strip():
            return empty
        if parse_cost(self.body) > MAX_BODY_PARSE_COST:
            raise HttpError(413, "request body holds too many JSON values: "
                                 + describe_cost(parse_cost(self.body), MAX_BODY_PARSE_COST))
        try:
            return strict_json_loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise HttpError(400, f"request body is not valid JSON: {error}") from None
        except RecursionError:
            raise HttpError(400, "request body is nested too deeply") from None


@dataclass
class Response:
    """An answer: status, body bytes, content type and extra headers."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


def json_bytes(payload: Any) -> bytes:
    """Compact UTF-8 JSON; a non-finite number goes out as null."""
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(to_jsonable(payload), separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(status, json_bytes(payload))


def error_envelope(status: int, message: str) -> dict[str, Any]:
    """The one shape of every error answer."""
    return {"error": {"status": status, "message": message}}


def error_text(payload: Any, fallback: str) -> str:
    """The message of an error answer (for clients of these servers)."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(error) if error else fallback


def error_response(status: int, message: str) -> Response:
    return json_response(error_envelope(status, message), status)


def check_bind(host: str, token: str | None, what: str = "the server") -> None:
    """Refuse to listen beyond loopback without a token."""
    if not is_loopback(host) and not token:
        raise PosttrainError(
            f"binding {host} exposes {what} beyond this machine; pass --token <secret> "
            "(clients then send 'Authorization: Bearer <secret>') or bind 127.0.0.1")


@dataclass(frozen=True)
class Rules:
    """What a server enforces before a handler runs (module docstring)."""

    token: str | None = None
    #: a tokens file's ``{token: name}`` (``posttrain.access``): named callers beside the token
    tokens: Mapping[str, str] | None = None
    #: which requests need the token: ``needs_token(method, path)``; all of them by default
    needs_token: Callable[[str, str], bool] = lambda method, path: True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    read_timeout_s: float = READ_TIMEOUT_SECONDS
    name: str = "posttrain server"  # for the lines it logs
    verbose: bool = False  # log every request (uvicorn's access log)
    #: what the message of a 500 may show of a bug's text (stderr gets all of it): the
    #: service hides its folders' absolute paths with it
    public_text: Callable[[str], str] = lambda text: text
    #: a WebSocket whose client sends nothing for this long is closed (its session ends)
    idle_socket_s: float = IDLE_SOCKET_SECONDS


# ------------------------------------------------------------------ the ASGI layers


async def send_response(send: Any, response: Response, *, close: bool = False,
                        hold_open: bool = False) -> None:
    """Send ``response``; ``hold_open`` leaves the ASGI response unfinished (the bytes are
    all sent) so the caller can still drain the request body before finishing it."""
    headers = [(b"content-type", response.content_type.encode()),
               (b"content-length", str(len(response.body)).encode()),
               (b"cache-control", b"no-store")]
    headers += [(name.lower().encode(), value.encode("latin-1"))
                for name, value in response.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": hold_open})


class Guard:
    """The checks every request passes before routing (module docstring)."""

    def __init__(self, app: Any, server: HttpServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.datastructures import Headers

        rules = self.server.rules
        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        host, port = self.server.server_address
        refusal = foreign_request(method, headers, host, port)
        if refusal is not None:
            await send_response(send, error_response(*refusal), close=True)
            return
        if (rules.token is not None or rules.tokens) and rules.needs_token(method, path) \
                and identify(headers, rules.token, rules.tokens) is None:
            # the body, however large it is announced to be, stays unread
            await send_response(send, error_response(
                401, f"missing or wrong token: {TOKEN_HINT}"), close=True)
            return
        if method in BODY_METHODS:
            problem = self._body_problem(headers)
            if problem is not None:
                status, message, length = problem
                if status == 413 and length <= DRAIN_LIMIT:
                    await send_response(send, error_response(status, message), close=True,
                                        hold_open=True)
                    await drain(receive, rules.read_timeout_s)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                else:
                    await send_response(send, error_response(status, message), close=True)
                return
        await self.app(scope, timed(receive, rules.read_timeout_s), send)

    async def _socket(self, scope: dict, receive: Any, send: Any) -> None:
        """A WebSocket: the Host/Origin guard and the token before the handshake is
        accepted, then the app with idle sockets closed."""
        from starlette.datastructures import Headers

        rules = self.server.rules
        headers = Headers(scope=scope)
        host, port = self.server.server_address
        refusal = foreign_socket(headers, host, port)
        if refusal is None and (rules.token is not None or rules.tokens) \
                and rules.needs_token("WEBSOCKET", scope["path"]) \
                and identify(headers, rules.token, rules.tokens) is None:
            refusal = 401, f"missing or wrong token: {TOKEN_HINT}"
        if refusal is not None:
            await refuse_socket(scope, receive, send, *refusal)
            return
        await self.app(scope, *idle_closing(receive, send, rules.idle_socket_s))

    def _body_problem(self, headers: Any) -> tuple[int, str, int] | None:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return 411, "send the body with a Content-Length, not chunked", 0
        raw = headers.get("content-length")
        if raw is None:
            return None  # no body
        try:
            length = int(raw)
        except ValueError:
            return 400, f"Content-Length: not a number: {raw!r}", 0
        if length < 0:
            return 400, "Content-Length: negative", 0
        limit = self.server.rules.max_body_bytes
        if length > limit:
            return 413, (f"body of {length} bytes is over the limit of {limit} bytes; send "
                         "smaller requests"), length
        return None


async def refuse_socket(scope: dict, receive: Any, send: Any, status: int,
                        message: str) -> None:
    """Refuse a WebSocket's handshake: answered ``status`` with the error envelope where
    the server can send a plain response instead of the upgrade (uvicorn can), else
    closed (1008) before it is accepted (the client sees 403)."""
    connect = await receive()
    if connect.get("type") != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json_bytes(error_envelope(status, message))
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def idle_closing(receive: Any, send: Any, seconds: float) -> tuple[Any, Any]:
    """``receive`` and ``send`` for a WebSocket app, closing the socket (1001) when the
    client sends nothing for ``seconds``: the app then reads a disconnect, as when the
    client leaves, and ends its session; what it sends after that is dropped."""
    closed = False

    async def receive_or_idle() -> Any:
        nonlocal closed
        if closed:
            return {"type": "websocket.disconnect", "code": 1001}
        try:
            return await asyncio.wait_for(receive(), seconds)
        except asyncio.TimeoutError:
            closed = True
            await send({"type": "websocket.close", "code": 1001,
                        "reason": f"idle for {seconds:g} s"})
            return {"type": "websocket.disconnect", "code": 1001}

    async def send_unless_closed(message: Any) -> None:
        if not closed:
            await send(message)

    return receive_or_idle, send_unless_closed


class WholeBody:
    """A mounted app's request body read whole before the app runs (the guard has
    already bounded it by its Content-Length): a client that stalls inside it is answered
    408 and a JSON body that is not strict JSON (NaN, Infinity, ``1e400``, bad UTF-8,
    nesting past Python's limit) 400, by the core; the app reads the same bytes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        try:
            while True:
                message = await receive()  # timed by the guard
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
        except ClientStalled as error:
            await send_response(send, error_response(
                408, f"the request body stalled: {error}"), close=True)
            return
        body = b"".join(chunks)
        problem = json_body_problem(scope, body)
        if problem is not None:
            await send_response(send, error_response(400, problem))
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def json_body_problem(scope: dict, body: bytes) -> str | None:
    """Why a body declared JSON is not strict JSON, or None (a body of another type, or
    none, is the app's to read)."""
    from starlette.datastructures import Headers

    kind = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
    if not body.strip() or kind != "application/json":
        return None
    if parse_cost(body) > MAX_BODY_PARSE_COST:
        return ("request body holds too many JSON values: "
                + describe_cost(parse_cost(body), MAX_BODY_PARSE_COST))
    try:
        strict_json_loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return f"request body is not valid JSON: {echo(str(error))}"
    except RecursionError:
        return "request body is nested too deeply"
    return None


def answers_in_envelope(app: Any, rules: Rules) -> None:
    """A Starlette or FastAPI app's own refusals, its request validation and its bugs
    answered in the core's envelope: a refusal with its status and text, a validation
    error 422 naming each field (never echoing the value: it may be huge or not JSON), a
    ``PosttrainError`` with an ``http_status`` that status, anything else 500, logged."""
    from starlette.exceptions import HTTPException
    from starlette.responses import Response as StarletteResponse

    def answer(status: int, message: str) -> Any:
        response = error_response(status, message)
        return StarletteResponse(response.body, status, {"cache-control": "no-store"},
                                 media_type=response.content_type)

    async def refused(request: Any, error: HTTPException) -> Any:
        detail = error.detail if isinstance(error.detail, str) else json.dumps(
            to_jsonable(error.detail))[:2000]
        return answer(error.status_code, detail)

    async def invalid(request: Any, error: Any) -> Any:
        fields = [f"{'.'.join(str(part) for part in problem.get('loc', ()))}: "
                  f"{problem.get('msg', 'invalid')}" for problem in error.errors()[:20]]
        return answer(422, "invalid request: " + "; ".join(fields))

    async def bug(request: Any, error: Exception) -> Any:
        status = error.http_status if isinstance(error, PosttrainError) else None
        if status is not None:
            return answer(status, rules.public_text(str(error)))
        import traceback

        print(f"{rules.name}: {request.method} {request.url.path}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)
        return answer(500, rules.public_text(f"internal error: {type(error).__name__}"))

    app.add_exception_handler(HTTPException, refused)
    try:
        from fastapi.exceptions import RequestValidationError
    except ImportError:
        pass
    else:
        app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, bug)


class ClientStalled(Exception):
    """The client stopped sending its body for longer than the read timeout."""


def timed(receive: Any, seconds: float) -> Any:
    async def receive_in_time() -> Any:
        try:
            return await asyncio.wait_for(receive(), seconds)
        except asyncio.TimeoutError:
            raise ClientStalled(f"no body bytes for {seconds:g} s") from None
    return receive_in_time


async def drain(receive: Any, seconds: float) -> None:
    """Read and drop what is left of a request body."""
    while True:
        try:
            message = await asyncio.wait_for(receive(), seconds)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body"):
            return


def endpoint(handler: Handler, rules: Rules) -> Any:
    """A Starlette endpoint running ``handler`` in the thread pool."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response as StarletteResponse

    async def answer(request: Any) -> Any:
        try:
            body = await request.body()
        except ClientStalled as error:
            response = error_response(408, f"the request body stalled: {error}")
            return StarletteResponse(response.body, 408, {"connection": "close"},
                                     media_type=response.content_type)
        except ClientDisconnect:  # it hung up inside its body: no one to answer, no bug
            return StarletteResponse(b"", 400, {"connection": "close"})
        ours = Request(request.method, request.url.path, dict(request.path_params),
                       parse_qs(request.url.query), request.headers, body,
                       identify(request.headers, rules.token, rules.tokens) or NOBODY)
        try:
            response = await run_in_threadpool(handler, ours)
        except HttpError as error:
            response = error_response(error.status, error.message)
        except Exception as error:
            status = error.http_status if isinstance(error, PosttrainError) else None
            if status is not None:  # a known state of the server (a damaged store): said
                response = error_response(status, rules.public_text(str(error)))
            else:  # a bug, not bad input: answer it, log it, keep serving
                import traceback

                print(f"{rules.name}: {request.method} {request.url.path}: "
                      f"{type(error).__name__}: {error}", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                response = error_response(500, rules.public_text(
                    f"internal error: {type(error).__name__}: {error}"))
        return StarletteResponse(response.body, response.status,
                                 {"cache-control": "no-store", **response.headers},
                                 media_type=response.content_type)

    return answer


# ------------------------------------------------------------------ the server


def mounted_lifespan(mounted: Any) -> Any:
    """The server's lifespan running a mounted app's own startup and shutdown (OpenEnv
    starts its idle-session reaper there; Starlette does not pass the lifespan on to a
    mount)."""
    from contextlib import asynccontextmanager

    context = getattr(getattr(mounted, "router", None), "lifespan_context", None)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        if context is None:
            yield
            return
        async with context(mounted):
            yield

    return lifespan


def timed_protocol(seconds: float) -> Any:
    """uvicorn's h11 protocol with a deadline for a request's headers: a client that
    connects and sends nothing, or stops inside its headers, is disconnected after
    ``seconds`` (uvicorn itself only times out idle keep-alive connections, after a
    response). The deadline is armed when the connection opens and after each response,
    and disarmed when a request's headers are complete."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):  # type: ignore[misc]
        _deadline: Any = None
        _timed_cycle: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._timed_cycle = self.cycle
            self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            if self.cycle is self._timed_cycle and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self._deadline is not None and self.cycle is not self._timed_cycle:
                self._disarm()  # a new request's headers arrived

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def refusing_socket_protocol() -> Any:
    """uvicorn's WebSocket protocol, where a handshake answered with a plain response (a
    refusal: ``refuse_socket``) counts as completed: uvicorn 0.54 leaves it unmarked and
    logs a false "returned without completing handshake" error for every refusal."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    class RefusalCompletes(WebSocketsSansIOProtocol):  # type: ignore[misc]
        async def send(self, message: Any) -> None:
            await super().send(message)
            if message["type"] == "websocket.http.response.body" \
                    and not message.get("more_body", False):
                self.handshake_complete = True

    return RefusalCompletes



class HttpServer:
    """A Starlette app on uvicorn over a socket bound at construction.

    ``add_route`` before starting; ``start()`` serves on a background thread,
    ``serve_forever()`` in this one; ``shutdown()`` stops serving, ``server_close()``
    releases the socket."""

    def __init__(self, host: str, port: int, rules: Rules) -> None:
        import importlib.util

        missing = [name for name in ("starlette", "uvicorn")
                   if importlib.util.find_spec(name) is None]
        if missing:
            raise PosttrainError(f"{rules.name} needs {' and '.join(missing)}: "
                                 "pip install 'posttrain[ui]'")
        self.rules = rules
        self.routes: list[Any] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as error:
            self.socket.close()
            raise PosttrainError(f"cannot listen on {host}:{port} ({error.strerror or error}): "
                                 "choose another --port (0 picks a free one) or stop what "
                                 "is using it") from None
        self.socket.listen(128)
        self.server_address: tuple[str, int] = (host, self.socket.getsockname()[1])
        self._uvicorn: Any = None
        self._starlette: Any = None
        self._thread: threading.Thread | None = None
        self.mounted: Any = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8765``."""
        host, port = self.server_address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Serve ``method`` requests on ``path`` (Starlette syntax, ``{name}`` parameters)
        with ``handler``; routes are tried in the order added (a route added while the
        server runs is served from then on)."""
        from starlette.routing import Route

        route = Route(path, endpoint(handler, self.rules), methods=[method.upper()])
        self.routes.append(route)
        if self._starlette is not None:  # already serving: the live router gets it too
            self._starlette.router.routes.append(route)

    def mount(self, app: Any) -> None:
        """Serve another framework's ASGI app (a Starlette or FastAPI one: OpenEnv's, for
        ``posttrain env serve``) on every path the routes leave, behind the same guard,
        with its body read whole first and its errors in the envelope (module
        docstring); its startup and shutdown run with the server's. Before starting."""
        answers_in_envelope(app, self.rules)
        self.mounted = app

    def app(self) -> Any:
        """The ASGI app: the guard around Starlette's router, errors in the envelope."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import Response as StarletteResponse

        async def http_error(request: Any, error: HTTPException) -> Any:
            if error.status_code == 404:
                message = f"no such endpoint: {request.method} {request.url.path}"
            elif error.status_code == 405:
                message = f"{request.method} is not allowed on {request.url.path}"
            else:
                message = str(error.detail)
            response = error_response(error.status_code, message)
            return StarletteResponse(response.body, error.status_code,
                                     dict(error.headers or {}), media_type="application/json")

        routes = list(self.routes)
        lifespan = None
        if self.mounted is not None:
            from starlette.routing import Mount

            routes.append(Mount("", app=WholeBody(self.mounted)))
            lifespan = mounted_lifespan(self.mounted)
        app = Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                        lifespan=lifespan)
        self._starlette = app
        return Guard(app, self)

    def _server(self) -> Any:
        import uvicorn

        config = uvicorn.Config(self.app(), http=timed_protocol(self.rules.read_timeout_s),
                                ws=refusing_socket_protocol(),
                                log_level="info" if self.rules.verbose else "warning",
                                access_log=self.rules.verbose,
                                lifespan="off" if self.mounted is None else "on",
                                ws_max_size=self.rules.max_body_bytes,
                                timeout_keep_alive=5, timeout_graceful_shutdown=2)
        self._uvicorn = uvicorn.Server(config)
        return self._uvicorn

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Serve in this thread until ``shutdown()`` (``poll_interval`` is not used)."""
        self._server().run(sockets=[self.socket])

    def start(self) -> HttpServer:
        """Serve on a daemon thread; returns once the server accepts connections."""
        server = self._server()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self.socket]},
                                        name=self.rules.name, daemon=True)
        self._thread.start()
        while not server.started and self._thread.is_alive():
            threading.Event().wait(0.01)
        return self

    def shutdown(self) -> None:
        """Stop serving (requests in flight get a moment to finish)."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def server_close(self) -> None:
        """Release the socket."""
        self.socket.close()
