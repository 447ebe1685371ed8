"""The dashboard's pages on a run server: the run list, the run page and their static files.

The pages are plain HTML and vanilla JavaScript shipped inside the package
(``posttrain/ui/templates`` and ``posttrain/ui/static``): no build step, nothing fetched
from a CDN, so the dashboard works on a machine without internet. The browser reads
everything else from the server's JSON API (``posttrain/runs/server.py``) and polls it
for live updates.

Routes added to a ``RunServer``:

| path                 | answer                                                        |
|----------------------|---------------------------------------------------------------|
| `/`                  | the run list (`templates/runs.html`)                          |
| `/runs/<name>`       | a run's page (`templates/run.html`); the run store prints this URL |
| `/static/<file>`     | a file of `static/` (one path segment, listed files only)     |
| `/favicon.ico`       | 204, so the browser's automatic request leaves no error       |
| `/api/runs/<name>/samples` | graded holdout rows (see ``read_samples``)         |

``/api/runs/<name>/samples?which=before|after&limit=N`` reads the run folder next to the
store (``<runs>/<name>/holdout_<which>.jsonl``; default after, 40 rows, at most 200): what
the policy said, and for a multi-turn run each episode's ``transcript``.

A run name that could escape the runs folder (``..``, ``.hidden``) is a 400; a path
with a slash after ``/runs/`` or ``/static/`` matches no route, so it is a 404.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.access import NOBODY, Caller, made_by
from posttrain.http_core import TOKEN_HINT
from posttrain.jsonl import MAX_PARSE_COST, parse_cost, stream_parse_cost
from posttrain.runs.ops import SAMPLE_SOURCES, RunStoreError, check_run_name
from posttrain.runs.server import (
    MAX_LISTED_ITEMS,
    MAX_STEP,
    HttpError,
    Request,
    Response,
    RunServer,
    csv_response,
    json_response,
    serve,
)
from posttrain.text import echo

PACKAGE_DIR = Path(__file__).resolve().parent
STATIC_DIR = PACKAGE_DIR / "static"
TEMPLATES_DIR = PACKAGE_DIR / "templates"

CONTENT_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

# Pages take no inline script or style and load nothing from elsewhere: a run name or a
# config value that smuggled markup into the page could not run it.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


# the graded rows a run folder keeps (posttrain.train.measure), by the page's name for them
SAMPLE_FILES = {"before": "holdout_before.jsonl", "after": "holdout_after.jsonl"}
SAMPLE_FIELDS = ("prompt", "category", "sample", "score", "reward", "reply", "transcript",
                 "episode", "markers", "scenario_id")
DEFAULT_SAMPLES = 40
MAX_SAMPLES = 200
#: the most a rows export may cost to parse (``jsonl.parse_cost``; a 100,000-row holdout
#: of long replies is about a third of it)
MAX_SERVED_ROWS_COST = 512 * 1024**2
#: the dashboard's read routes and what bounds each (``READ_CAPS`` of the run server)
DASHBOARD_READ_CAPS: dict[str, str] = {
    "/": "a static page", "/runs/{name}": "a static page", "/compare": "a static page",
    "/static/{file}": "one of the dashboard's own files", "/favicon.ico": "nothing",
    "/api/runs/{name}/samples": f"at most {MAX_SAMPLES} rows of a file, read no further; the "
                                "kept rows of one check (at most 64 each, set on ingest); "
                                f"at most {MAX_LISTED_ITEMS:,} checks listed",
    "/api/runs/{name}/rows.{format}": "one holdout file, refused (413) past "
                                      f"{MAX_SERVED_ROWS_COST // 2**20} MB of parsing cost",
}


# the columns of a graded-rows CSV export (markers, transcript and episode as JSON text)
ROW_CSV_FIELDS = ("eval_run", "scenario_id", "category", "sample", "prompt", "reply", "score",
                  "reward", "markers", "transcript", "episode")


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else value


def read_samples(path: Path, limit: int | None,
                 fields: tuple[str, ...] | None = SAMPLE_FIELDS) -> list[dict[str, Any]] | None:
    """Rows of a graded-rows file: the first ``limit`` of evaluation run 0 with ``fields``
    (the page's view), or, with ``limit`` None, every row of every evaluation run (with
    ``fields`` None: every field; an export). None when the file does not exist (yet).
    Lines that are not JSON objects are skipped: the run's own tools check the file."""
    if not path.is_file():
        return None
    rows: list[dict[str, Any]] = []
    spent = 0  # what the rows read so far may hold (a folder copied in is anyone's file)
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            spent += parse_cost(line)
            if spent > MAX_PARSE_COST:
                break  # the rows within the budget are served, the rest not read
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(row, dict):
                continue
            if limit is not None and row.get("eval_run", 0) != 0:
                continue
            rows.append(row if fields is None else {k: row[k] for k in fields if k in row})
            if limit is not None and len(rows) >= limit:
                break
    return rows


def static_files() -> dict[str, Path]:
    """The files ``/static/<name>`` may serve: every regular file directly in ``static/``."""
    return {
        path.name: path
        for path in STATIC_DIR.iterdir()
        if path.is_file() and not path.name.startswith(".")
    }


def _page(template: str) -> Response:
    body = (TEMPLATES_DIR / template).read_bytes()
    return Response(200, body, CONTENT_TYPES[".html"], dict(PAGE_HEADERS))


def add_dashboard(server: RunServer) -> RunServer:
    """Register the dashboard's page and static routes on ``server``; returns it.

    Static files are looked up in a table built here (a name is served only if it is a
    file of ``static/`` now), so no request path is ever joined onto a folder.
    """
    files = static_files()
    server.read_caps.update(DASHBOARD_READ_CAPS)

    def check_reader(name: str, caller: Caller) -> None:
        """Graded rows and kept replies are a run's user data (every prompt and reply):
        on a server with named people (``--tokens``) only the run's owner and the
        administrator read them (401 without a token, 403 with another person's). With no
        tokens file they are read as every other page is: by whoever reaches the port (a
        single ``--token`` guards writes only; docs/security.md)."""
        if not server.rules.tokens:
            return
        if caller is NOBODY:
            raise HttpError(401, f"run {name!r}'s graded rows and replies are its owner's: "
                                 f"{TOKEN_HINT} (the owner's or the administrator's)")
        known = server.store.get_run(name)
        owner = known["owner"] if known is not None else None
        if not caller.may_change(owner):
            raise HttpError(403, f"run {name!r}'s graded rows and replies are its owner's "
                                 f"(it was {made_by(owner)}); only they and the server's "
                                 "--token read them")

    def run_list(request: Request) -> Response:
        return _page("runs.html")

    def run_page(request: Request) -> Response:
        try:
            check_run_name(request.match["name"])
        except RunStoreError as error:
            raise HttpError(400, str(error)) from None
        # an unknown run still gets its page: it may be about to start, and the page
        # says "no run named ..." until it does
        return _page("run.html")

    def compare_page(request: Request) -> Response:
        return _page("compare.html")  # the page reads ?runs=a,b,c and checks it itself

    def static(request: Request) -> Response:
        path = files.get(request.match["file"])
        if path is None:
            raise HttpError(404, f"no static file {request.match['file']!r}")
        content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        return Response(200, path.read_bytes(), content_type, {"X-Content-Type-Options": "nosniff"})

    def no_icon(request: Request) -> Response:
        return Response(204, b"", "image/x-icon")

    def samples(request: Request) -> Response:
        """Graded replies: ``which=before|after`` from the run folder (``limit`` rows of
        evaluation run 0), or ``which=monitor|rollouts&step=N`` from the run store (what
        the hack monitor kept at that check). Every answer lists the checks kept."""
        try:
            name = check_run_name(request.match["name"])
        except RunStoreError as error:
            raise HttpError(400, str(error)) from None
        check_reader(name, request.caller)
        which = request.choice_param("which", "after", [*SAMPLE_FILES, *SAMPLE_SOURCES])
        checks = server.store.sample_checks(name, limit=MAX_LISTED_ITEMS)
        if which in SAMPLE_SOURCES:
            step = request.int_param("step", None, 0, MAX_STEP)
            if step is None:
                raise HttpError(400, f"which={which} needs step=<a check's step>")
            rows = server.store.sample_rows(name, which, step)
            return json_response({"run": name, "which": which, "step": step,
                                  "available": rows is not None, "rows": rows or [],
                                  "checks": checks})
        limit = request.int_param("limit", DEFAULT_SAMPLES, 1, MAX_SAMPLES)
        path = server.runs_root / name / SAMPLE_FILES[which]
        rows = read_samples(path, limit)
        return json_response({"run": name, "which": which, "available": rows is not None,
                              "rows": rows or [], "checks": checks})

    server.add_route("GET", "/", run_list)
    server.add_route("GET", "/runs/{name}", run_page)
    server.add_route("GET", "/compare", compare_page)
    server.add_route("GET", "/static/{file}", static)
    server.add_route("GET", "/favicon.ico", no_icon)
    server.add_route("GET", "/api/runs/{name}/samples", samples)

    def rows_export(request: Request) -> Response:
        """Every graded row of one holdout evaluation file, as JSON or CSV (a download)."""
        try:
            name = check_run_name(request.match["name"])
        except RunStoreError as error:
            raise HttpError(400, str(error)) from None
        check_reader(name, request.caller)
        which = request.choice_param("which", "after", list(SAMPLE_FILES))
        path = server.runs_root / name / SAMPLE_FILES[which]
        # the whole file is served: its parsing cost bounded before it is read
        if path.is_file() and stream_parse_cost(path.open("rb")) > MAX_SERVED_ROWS_COST:
            raise HttpError(413, f"run {name!r}'s {SAMPLE_FILES[which]} is too large to serve "
                                 "in one answer: export it with `posttrain runs export`")
        rows = read_samples(path, limit=None, fields=None)
        if rows is None:
            raise HttpError(404, f"run {name!r} has no {SAMPLE_FILES[which]} (yet)")
        filename = f"{name}-holdout-{which}"
        if request.match["format"] not in ("json", "csv"):
            raise HttpError(404, f"rows.{echo(request.match['format'])}: ask for rows.json or "
                                 "rows.csv")
        if request.match["format"] == "csv":
            return csv_response(list(ROW_CSV_FIELDS),
                                [[_csv_cell(row.get(key)) for key in ROW_CSV_FIELDS]
                                 for row in rows], f"{filename}.csv")
        response = json_response({"run": name, "which": which, "rows": rows})
        response.headers["Content-Disposition"] = f'attachment; filename="{filename}.json"'
        return response

    server.add_route("GET", "/api/runs/{name}/rows.{format}", rows_export)
    return server


def dashboard_server(store: str | Path, host: str = "127.0.0.1", port: int = 8765,
                     token: str | None = None, runs_root: str | Path | None = None,
                     tokens: Mapping[str, str] | None = None) -> RunServer:
    """A run server over ``store`` (a SQLite file's path or a PostgreSQL URL; ``runs_root``:
    the run folders, default the SQLite file's folder) with the dashboard's pages added.

    Not started: call ``serve_forever()`` (or ``start_in_thread``). ``port`` 0 picks a
    free port; ``token`` (and the tokens file's ``tokens``) protect the writes (reads stay
    open).
    """
    return add_dashboard(serve(store, host, port, token, runs_root, tokens))
