"""The run server: a small standard-library HTTP server over a ``SqliteRunStore``.

Training processes post batched ops to it (``HttpRunStore``); the dashboard reads JSON
from it. Endpoints (all JSON):

| method | path                         | what                                            |
|--------|------------------------------|-------------------------------------------------|
| POST   | `/api/ingest`                | `{"batch": id, "ops": [...]}`; bearer token     |
| GET    | `/api/runs`                  | the run list                                    |
| GET    | `/api/runs/<name>`           | one run: config, summary, progress, notes, alarms |
| GET    | `/api/runs/<name>/metrics`   | `?names=a,b&max_points=2000&after=<step>`       |
| GET    | `/api/runs/<name>/metrics.csv` | `?names=a,b` (default: all): every point, CSV |
| POST   | `/api/runs/<name>/delete`    | `{"force": false}`; bearer token; 409 while alive |

Routing is a table of (method, path regex, handler); the dashboard adds its pages with
``server.add_route``. A handler gets a ``Request`` and returns a ``Response``; raising
``HttpError`` turns into a JSON ``{"error": ...}`` answer with that status. Bad input
is always a 4xx with a message, never a 500.
"""

from __future__ import annotations

import hmac
import json
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from posttrain.http_guard import foreign_request
from posttrain.jsonl import strict_json_loads
from posttrain.runs.ops import RunStillAlive, RunStoreError, check_run_name, to_jsonable
from posttrain.runs.removal import NoSuchRun, delete_run
from posttrain.runs.sqlite_store import SqliteRunStore

MAX_BODY_BYTES = 32 * 1024 * 1024
SOCKET_TIMEOUT_SECONDS = 30
MAX_SERIES_POINTS = 100_000
DEFAULT_MAX_POINTS = 2000


class HttpError(Exception):
    """Raise in a handler to answer ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """What a handler sees: method, path, the regex match of the route, query, headers, body."""

    method: str
    path: str
    match: re.Match[str]
    query: dict[str, list[str]]
    headers: Any
    body: bytes = b""

    def param(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``, or ``default``."""
        values = self.query.get(name)
        return values[0] if values else default

    def json(self) -> Any:
        """The body parsed as JSON; ``HttpError(400)`` when it is not. NaN, Infinity and
        numbers too large for a float (1e400) are refused too, and so is nesting too deep
        to parse."""
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


def csv_response(header: list[str], rows: Any, filename: str) -> Response:
    """A CSV download (UTF-8, one header line) named ``filename``."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return Response(200, buffer.getvalue().encode("utf-8"), "text/csv; charset=utf-8",
                    {"Content-Disposition": f'attachment; filename="{filename}"'})


def json_response(payload: Any, status: int = 200) -> Response:
    """A JSON answer (UTF-8, compact). Never NaN or Infinity, which no browser parses (one
    such value broke the whole run list): a non-finite number goes out as null."""
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(to_jsonable(payload), separators=(",", ":"), allow_nan=False)
    return Response(status, text.encode("utf-8"))


Handler = Callable[[Request], Response]


class RunServer(ThreadingHTTPServer):
    """The threaded HTTP server; ``store`` is its ``SqliteRunStore``, ``routes`` its table."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: SqliteRunStore,
                 token: str | None = None) -> None:
        self.store = store
        self.token = token or None
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        super().__init__(address, _RequestHandler)
        for method, pattern, handler in default_routes(self):
            self.add_route(method, pattern, handler)

    def server_close(self) -> None:
        """Close the socket and the store."""
        super().server_close()
        self.store.close()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8765``."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def add_route(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method`` requests whose path fully matches ``pattern`` with ``handler``.

        Routes are tried in the order added; named groups reach the handler via
        ``request.match``.
        """
        self.routes.append((method.upper(), re.compile(pattern), handler))

    def check_token(self, request: Request) -> None:
        """``HttpError(401)`` unless the request carries this server's bearer token (when set)."""
        if self.token is None:
            return
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8")):
            raise HttpError(401, "missing or wrong token: send 'Authorization: Bearer <token>' "
                                 "with the server's token (POSTTRAIN_TOKEN)")

    def dispatch(self, method: str, raw_path: str, headers: Any, body: bytes) -> Response:
        """Find the route for a request and run it, mapping errors to JSON answers."""
        parts = urlsplit(raw_path)
        path = unquote(parts.path)
        allowed = []
        for route_method, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            if route_method != method:
                allowed.append(route_method)
                continue
            request = Request(method, path, match, parse_qs(parts.query), headers, body)
            try:
                return handler(request)
            except HttpError as error:
                return json_response({"error": error.message}, error.status)
            except RunStoreError as error:
                return json_response({"error": str(error)}, 400)
        if allowed:
            response = json_response({"error": f"{method} not allowed on {path}"}, 405)
            response.headers["Allow"] = ", ".join(sorted(set(allowed)))
            return response
        return json_response({"error": f"no such endpoint: {path}"}, 404)


class _RequestHandler(BaseHTTPRequestHandler):
    server: RunServer
    protocol_version = "HTTP/1.1"
    # a client that opens a connection and sends nothing (or stops mid-body) holds a
    # thread until this many seconds pass, then the connection is closed
    timeout = SOCKET_TIMEOUT_SECONDS

    def _handle(self, method: str) -> None:
        body = b""
        refusal = self._foreign_request(method)
        if refusal is not None:
            self.close_connection = True
            self._send(json_response({"error": refusal[1]}, refusal[0]))
            return
        if method == "POST" and not self._token_ok():
            # every write needs the token: refuse before reading a body of up to 32 MiB
            self.close_connection = True
            self._send(json_response(
                {"error": "missing or wrong token: send 'Authorization: Bearer <token>' with "
                          "the server's token (POSTTRAIN_TOKEN)"}, 401))
            return
        if method == "POST":
            length_header = self.headers.get("Content-Length")
            try:
                length = int(length_header) if length_header is not None else -1
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                self._send(json_response({"error": "a Content-Length header is required"}, 411))
                return
            if length > MAX_BODY_BYTES:
                self._send(json_response(
                    {"error": f"body of {length} bytes is over the {MAX_BODY_BYTES} limit; "
                              "send smaller batches"}, 413))
                self.close_connection = True
                return
            body = self.rfile.read(length)
        try:
            response = self.server.dispatch(method, self.path, self.headers, body)
        except Exception as error:  # a bug, not bad input: say so without a traceback page
            print(f"posttrain server: {method} {self.path}: {type(error).__name__}: {error}",
                  file=sys.stderr)
            response = json_response({"error": f"internal error: {type(error).__name__}"}, 500)
        self._send(response)

    def _foreign_request(self, method: str) -> tuple[int, str] | None:
        """Why a web page could have forged this request (``posttrain.http_guard``)."""
        bound, port = self.server.server_address[:2]
        return foreign_request(method, self.headers, str(bound), int(port))

    def _token_ok(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode("utf-8"), f"Bearer {token}".encode())

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per poll would drown the terminal


# --- the API handlers -------------------------------------------------------------------


def _run_name(request: Request) -> str:
    try:
        return check_run_name(request.match["name"])
    except RunStoreError as error:
        raise HttpError(400, str(error)) from None


def _int_param(request: Request, name: str, default: int | None, low: int,
               high: int | None = None) -> int | None:
    raw = request.param(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"query parameter {name!r} must be an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" + (f" and <= {high}" if high is not None else "")
        raise HttpError(400, f"query parameter {name!r} must be {bounds}, got {value}")
    return value


def default_routes(server: RunServer) -> list[tuple[str, str, Handler]]:
    """The API routes of a run server (the dashboard adds its own after these)."""
    store = server.store

    def ingest(request: Request) -> Response:
        server.check_token(request)
        payload = request.json()
        if not isinstance(payload, dict) or "ops" not in payload:
            raise HttpError(400, "expected a JSON object {\"batch\": id, \"ops\": [...]}")
        batch_id = payload.get("batch")
        if batch_id is not None and (not isinstance(batch_id, str) or len(batch_id) > 100):
            raise HttpError(400, "'batch' must be a string of at most 100 characters")
        applied = store.apply(payload["ops"], batch_id=batch_id)
        return json_response({"ok": True, "applied": applied, "duplicate": applied == 0
                              and bool(payload["ops"])})

    def list_runs(request: Request) -> Response:
        return json_response({"runs": store.list_runs()})

    def get_run(request: Request) -> Response:
        run = store.get_run(_run_name(request))
        if run is None:
            raise HttpError(404, f"no run named {request.match['name']!r}")
        return json_response(run)

    def delete(request: Request) -> Response:
        server.check_token(request)
        payload = request.json() if request.body else {}
        if not isinstance(payload, dict) or not isinstance(payload.get("force", False), bool):
            raise HttpError(400, 'expected a JSON object {"force": true|false}')
        try:
            deleted = delete_run(store, store.path.parent, _run_name(request),
                                 force=payload.get("force", False))
        except NoSuchRun as error:
            raise HttpError(404, str(error)) from None
        except RunStillAlive as error:
            raise HttpError(409, str(error)) from None
        return json_response({"ok": True, "deleted": deleted.name, "record": deleted.record,
                              "folder": deleted.folder is not None})

    def get_metrics(request: Request) -> Response:
        name = _run_name(request)
        available = store.metric_names(name)
        wanted_param = request.param("names")
        wanted = [n for n in wanted_param.split(",") if n] if wanted_param else []
        max_points = _int_param(request, "max_points", DEFAULT_MAX_POINTS, 1, MAX_SERIES_POINTS)
        after = _int_param(request, "after", None, -1)
        series = {
            metric: store.metric_series(name, metric, max_points=max_points, after_step=after)
            for metric in wanted
        }
        return json_response({"run": name, "names": available, "series": series})

    def get_metrics_csv(request: Request) -> Response:
        name = _run_name(request)
        wanted_param = request.param("names")
        wanted = [n for n in wanted_param.split(",") if n] if wanted_param else []
        if not wanted:
            wanted = store.metric_names(name)
        rows = []
        for metric in wanted:
            series = store.metric_series(name, metric)  # every point: this is an export
            rows += [[metric, step, value, moment] for step, value, moment in
                     zip(series["steps"], series["values"], series["times"], strict=True)]
        return csv_response(["metric", "step", "value", "time"], rows, f"{name}-metrics.csv")

    return [
        ("POST", r"/api/ingest", ingest),
        ("GET", r"/api/runs", list_runs),
        ("GET", r"/api/runs/(?P<name>[^/]+)", get_run),
        ("GET", r"/api/runs/(?P<name>[^/]+)/metrics", get_metrics),
        ("GET", r"/api/runs/(?P<name>[^/]+)/metrics\.csv", get_metrics_csv),
        ("POST", r"/api/runs/(?P<name>[^/]+)/delete", delete),
    ]


def serve(store_path: str | Path, host: str = "127.0.0.1", port: int = 8765,
          token: str | None = None) -> RunServer:
    """Create a run server on ``host:port`` (0 picks a free port) over the SQLite file.

    Returns the server without starting it: call ``serve_forever()`` (in a thread for
    tests, see ``start_in_thread``) and ``shutdown(); server_close()`` to stop.
    """
    return RunServer((host, port), SqliteRunStore(store_path), token)


def start_in_thread(server: RunServer, poll_interval: float = 0.05) -> threading.Thread:
    """Run ``server.serve_forever`` in a daemon thread and return the thread.

    ``poll_interval`` (seconds) bounds how long ``server.shutdown()`` waits.
    """
    thread = threading.Thread(target=server.serve_forever, args=(poll_interval,),
                              name="posttrain-run-server", daemon=True)
    thread.start()
    return thread
