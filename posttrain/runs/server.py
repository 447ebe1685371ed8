"""The run server: the HTTP API over a run store, SQLite or PostgreSQL (on
``posttrain.http_core``).

Training processes post batched ops to it (``HttpRunStore``); the dashboard reads JSON
from it. Endpoints (all JSON; errors in the core's envelope
``{"error": {"status", "message"}}``):

| method | path                         | what                                            |
|--------|------------------------------|-------------------------------------------------|
| POST   | `/api/ingest`                | `{"batch": id, "ops": [...]}`; bearer token     |
| GET    | `/api/runs`                  | the run list (the newest 1,000)                 |
| GET    | `/api/runs/<name>`           | one run: config, summary, progress, notes, alarms |
| GET    | `/api/runs/<name>/metrics`   | `?names=a,b&max_points=2000&after=<step>`: each |
|        |                              | name once, at most 64, unknown ones answered [] |
| GET    | `/api/runs/<name>/metrics.csv` | `?names=a,b` (default: all): every point, CSV; |
|        |                              | at most 1,000,000 points and 1,000 names        |
| POST   | `/api/runs/<name>/delete`    | `{"force": false}`; bearer token; 409 while alive |

Writes (every POST) need the token when the server has one; reads stay open. The
dashboard adds its pages with ``server.add_route``. Bind rules, the token check before a
body is read, the body limit, timeouts and the error envelope are the core's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.access import Caller, made_by
from posttrain.http_core import (
    Handler,
    HttpError,
    HttpServer,
    Request,
    Response,
    Rules,
    json_response,
)
from posttrain.runs.folder import is_run_folder
from posttrain.runs.ops import (
    NotYours,
    RunStillAlive,
    RunStoreError,
    StoreUnavailable,
    check_run_name,
)
from posttrain.runs.postgres_store import PostgresRunStore, is_postgres_url
from posttrain.runs.removal import NoSuchRun, delete_run
from posttrain.runs.sql_store import SqlRunStore
from posttrain.runs.sqlite_store import SqliteRunStore

__all__ = ["HttpError", "Request", "Response", "RunServer", "csv_response", "json_response",
           "serve", "start_in_thread"]

MAX_BODY_BYTES = 32 * 1024 * 1024
SOCKET_TIMEOUT_SECONDS = 30
MAX_SERIES_POINTS = 100_000
DEFAULT_MAX_POINTS = 2000
MAX_STEP = 2**63 - 1  # SQLite stores int64: a larger step would overflow, a 500
#: the most points one metrics.csv answer carries, and metric names one may ask for
MAX_CSV_POINTS = 1_000_000
MAX_CSV_NAMES = 1_000
#: the most metric names one /metrics request may ask for (the dashboard asks for a few)
MAX_SERIES_NAMES = 64
#: the most points one /metrics answer may carry (names asked x max_points)
MAX_SERIES_TOTAL = 1_000_000
#: the most runs /api/runs lists (the newest), and items of each list one run's record
#: answers (the latest notes and alarms, the first metric names and checks; ``cut``
#: names a list that held more)
MAX_LISTED_RUNS = 1_000
MAX_LISTED_ITEMS = 10_000

#: Every read route and what bounds its work before any query (a request past a cap is
#: refused, 400, or its answer cut, saying so). ``tests/test_server_doors.py`` holds
#: every GET route a server serves to an entry here (the dashboard's included) and tries
#: each cap; a route added without one fails it.
READ_CAPS: dict[str, str] = {
    "/api/runs": f"the newest {MAX_LISTED_RUNS:,} runs (``more``: how many were left out)",
    "/api/runs/{name}": f"at most {MAX_LISTED_ITEMS:,} notes, alarms, metric names and "
                        "checks (``cut`` names each list that held more)",
    "/api/runs/{name}/metrics": f"each name once, at most {MAX_SERIES_NAMES}, only names the "
                                f"run has; max_points at most {MAX_SERIES_POINTS:,}; names x "
                                f"max_points at most {MAX_SERIES_TOTAL:,}; the names listed "
                                f"at most {MAX_LISTED_ITEMS:,}",
    "/api/runs/{name}/metrics.csv": f"each name once, at most {MAX_CSV_NAMES:,}; at most "
                                    f"{MAX_CSV_POINTS:,} points (413 past it)",
}


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def spreadsheet_safe(cell: Any) -> Any:
    """A text cell a spreadsheet would run as a formula gets a leading quote, which
    spreadsheets show as text; numbers (negative ones too) pass through as numbers."""
    if isinstance(cell, str) and cell.startswith(FORMULA_STARTS):
        return "'" + cell
    return cell


def csv_response(header: list[str], rows: Any, filename: str) -> Response:
    """A CSV download (UTF-8, one header line) named ``filename``; text cells are
    neutralised so that a reply or a run name cannot run as a spreadsheet formula."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([spreadsheet_safe(cell) for cell in header])
    writer.writerows([spreadsheet_safe(cell) for cell in row] for row in rows)
    return Response(200, buffer.getvalue().encode("utf-8"), "text/csv; charset=utf-8",
                    {"Content-Disposition": f'attachment; filename="{filename}"'})


def writes_need_token(method: str, path: str) -> bool:
    """Only writes need the token: the pages and the API's reads stay open."""
    return method != "GET"


class RunServer(HttpServer):
    """The run server; ``store`` is its run store, ``runs_root`` the folder holding the run
    folders (default: the SQLite file's folder)."""

    def __init__(self, address: tuple[str, int], store: SqlRunStore,
                 token: str | None = None,
                 read_timeout_s: float = SOCKET_TIMEOUT_SECONDS,
                 runs_root: str | Path | None = None,
                 tokens: Mapping[str, str] | None = None) -> None:
        self.store = store
        if runs_root is None:
            if not isinstance(store, SqliteRunStore):
                store.close()
                raise ValueError("a run server over a database names its runs folder")
            runs_root = store.path.parent
        self.runs_root = Path(runs_root)
        self.token = token or None
        #: what bounds each read route's work (the dashboard adds its routes' entries)
        self.read_caps = dict(READ_CAPS)
        try:
            super().__init__(address[0], address[1],
                             Rules(token=self.token, tokens=tokens or None,
                                   needs_token=writes_need_token,
                                   max_body_bytes=MAX_BODY_BYTES,
                                   read_timeout_s=read_timeout_s, name="posttrain ui"))
        except Exception:
            store.close()
            raise
        for method, path, handler in default_routes(self):
            self.add_route(method, path, handler)

    def server_close(self) -> None:
        """Close the socket and the store."""
        super().server_close()
        self.store.close()


# --- the API handlers -------------------------------------------------------------------


def _run_name(request: Request) -> str:
    try:
        return check_run_name(request.match["name"])
    except RunStoreError as error:
        raise HttpError(400, str(error)) from None


def _store_call(call: Any, *args: Any, **kwargs: Any) -> Any:
    """A store call whose refusal of bad input is a 400."""
    try:
        return call(*args, **kwargs)
    except (StoreUnavailable, NotYours):
        raise  # the server's state (a 503) or the caller's rights (a 403): not a 400
    except RunStoreError as error:
        raise HttpError(400, str(error)) from None


def check_folder_claims(server: RunServer, ops: Any, caller: Caller) -> None:
    """Owners beyond the record: a tokens-file name's ``create`` for a name whose folder
    already holds a run (a folder copied in, one whose record was lost with a damaged
    store, one a dashboard on another store made) is refused, 403, unless that name owns
    the record of it; only the administrator may claim such a folder. (A run writing to
    its own folder sends its create before its ``config.json`` exists.)"""
    if not caller.restricted or not isinstance(ops, list):
        return
    for op in ops:
        if not isinstance(op, dict) or op.get("op") != "create" or not isinstance(
                op.get("run"), str):
            continue
        try:
            name = check_run_name(op["run"])
        except RunStoreError:
            continue  # the store refuses it with its own words
        if not is_run_folder(server.runs_root / name):
            continue
        known = server.store.get_run(name)
        if known is None or known.get("owner") != caller.name:
            whose = (f"was {made_by(known.get('owner'))}" if known is not None
                     else "has no record here")
            raise HttpError(403, f"run {name!r}: its folder holds a run that {whose}; a token "
                                 "writes only its own runs, and only the server's --token may "
                                 "claim another's folder (choose another run name)")


def default_routes(server: RunServer) -> list[tuple[str, str, Handler]]:
    """The API routes of a run server (the dashboard adds its own after these)."""
    store = server.store

    def ingest(request: Request) -> Response:
        payload = request.json()
        if not isinstance(payload, dict) or "ops" not in payload:
            raise HttpError(400, "expected a JSON object {\"batch\": id, \"ops\": [...]}")
        batch_id = payload.get("batch")
        if batch_id is not None and (not isinstance(batch_id, str) or len(batch_id) > 100):
            raise HttpError(400, "'batch' must be a string of at most 100 characters")
        check_folder_claims(server, payload["ops"], request.caller)
        try:
            # a named token writes only to its own runs and new ones, checked in the same
            # transaction as the write (nothing applied on a refusal)
            applied = _store_call(store.apply, payload["ops"], batch_id=batch_id,
                                  owner=request.caller.name or None, caller=request.caller)
        except NotYours as error:
            raise HttpError(403, str(error)) from None
        return json_response({"ok": True, "applied": applied, "duplicate": applied == 0
                              and bool(payload["ops"])})

    def list_runs(request: Request) -> Response:
        runs = store.list_runs(limit=MAX_LISTED_RUNS + 1)
        more = len(runs) > MAX_LISTED_RUNS
        return json_response({"runs": runs[:MAX_LISTED_RUNS],
                              **({"more": True} if more else {})})

    def get_run(request: Request) -> Response:
        run = _store_call(store.get_run, _run_name(request), limit=MAX_LISTED_ITEMS)
        if run is None:
            raise HttpError(404, f"no run named {request.match['name']!r}")
        return json_response(run)

    def delete(request: Request) -> Response:
        payload = request.json(empty={})
        if not isinstance(payload, dict) or not isinstance(payload.get("force", False), bool):
            raise HttpError(400, 'expected a JSON object {"force": true|false}')
        try:
            deleted = delete_run(store, server.runs_root, _run_name(request),
                                 force=payload.get("force", False), caller=request.caller)
        except NoSuchRun as error:  # without this machine's paths
            raise HttpError(404, error.public) from None
        except RunStillAlive as error:
            raise HttpError(409, str(error)) from None
        except NotYours as error:
            raise HttpError(403, str(error)) from None
        except StoreUnavailable:
            raise  # a 503 (its http_status)
        except RunStoreError as error:  # the folder could not be removed: the record stays
            raise HttpError(500, str(error)) from None
        return json_response({"ok": True, "deleted": deleted.name, "record": deleted.record,
                              "folder": deleted.folder is not None})

    def get_metrics(request: Request) -> Response:
        name = _run_name(request)
        wanted_param = request.param("names")
        # the work bounded by the request before any query: each name once, at most
        # MAX_SERIES_NAMES of them, and only names the run has (300 copies of one name on
        # a 100,000-point run took 49 s, one query each, open to anyone)
        wanted = list(dict.fromkeys(n for n in wanted_param.split(",") if n)) \
            if wanted_param else []
        if len(wanted) > MAX_SERIES_NAMES:
            raise HttpError(400, f"names: {len(wanted)} metrics asked, at most "
                                 f"{MAX_SERIES_NAMES} in one request")
        max_points = request.int_param("max_points", DEFAULT_MAX_POINTS, 1, MAX_SERIES_POINTS)
        if len(wanted) * max_points > MAX_SERIES_TOTAL:
            raise HttpError(400, f"{len(wanted)} names x max_points {max_points:,} is "
                                 f"{len(wanted) * max_points:,} points, at most "
                                 f"{MAX_SERIES_TOTAL:,} in one request")
        after = request.int_param("after", None, -1, MAX_STEP)
        available = _store_call(store.metric_names, name, limit=MAX_LISTED_ITEMS)
        known = set(_store_call(store.metric_names, name, among=wanted))
        series = {
            metric: (_store_call(store.metric_series, name, metric, max_points=max_points,
                                 after_step=after) if metric in known else [])
            for metric in wanted
        }
        return json_response({"run": name, "names": available, "series": series})

    def get_metrics_csv(request: Request) -> Response:
        # one query, its size bounded before the answer is built (one query per metric
        # name took 407 s for a run with 500,000 names, open to anyone)
        name = _run_name(request)
        wanted_param = request.param("names")
        wanted = list(dict.fromkeys(n for n in wanted_param.split(",") if n)) \
            if wanted_param else None
        if wanted is not None and len(wanted) > MAX_CSV_NAMES:
            raise HttpError(400, f"names: {len(wanted)} metrics asked, at most "
                                 f"{MAX_CSV_NAMES} in one export")
        rows = _store_call(store.metric_points, name, wanted, limit=MAX_CSV_POINTS)
        if rows is None:
            raise HttpError(413, f"run {name!r} has more than {MAX_CSV_POINTS:,} metric "
                                 "points: ask for fewer (?names=a,b) or export the run "
                                 "with `posttrain runs export`")
        return csv_response(["metric", "step", "value", "time"], [list(row) for row in rows],
                            f"{name}-metrics.csv")

    return [
        ("POST", "/api/ingest", ingest),
        ("GET", "/api/runs", list_runs),
        ("GET", "/api/runs/{name}", get_run),
        ("GET", "/api/runs/{name}/metrics", get_metrics),
        ("GET", "/api/runs/{name}/metrics.csv", get_metrics_csv),
        ("POST", "/api/runs/{name}/delete", delete),
    ]


def serve(store: str | Path, host: str = "127.0.0.1", port: int = 8765,
          token: str | None = None, runs_root: str | Path | None = None,
          tokens: Mapping[str, str] | None = None) -> RunServer:
    """Create a run server on ``host:port`` (0 picks a free port) over ``store``: a SQLite
    file's path or a PostgreSQL URL (``runs_root``: the run folders; default the SQLite
    file's folder). ``token``: the administrator's; ``tokens``: a tokens file's
    ``{token: name}`` (``posttrain.access``), whose runs record their creator.

    Returns the server without starting it: call ``serve_forever()`` (in a thread for
    tests, see ``start_in_thread``) and ``shutdown(); server_close()`` to stop. A damaged
    store file or an unreachable database does not stop it: every API call answers 503
    with the store and what to do, until it is fixed.
    """
    spec = str(store)
    if is_postgres_url(spec):
        if runs_root is None:
            raise ValueError("a run server over PostgreSQL needs runs_root (the run folders)")
        opened: SqlRunStore = PostgresRunStore(spec, hold_when_down=False)
    else:
        opened = SqliteRunStore(spec, tolerate_damage=True)
    return RunServer((host, port), opened, token, runs_root=runs_root, tokens=tokens)


def start_in_thread(server: RunServer, poll_interval: float = 0.05) -> threading.Thread:
    """Serve on a daemon thread (returns once it accepts connections) and return the
    thread; ``server.shutdown(); server.server_close()`` stops it."""
    server.start()
    assert server._thread is not None
    return server._thread
