"""The default run store: one SQLite file (``runs/posttrain.db``) in WAL mode.

WAL lets one writer append while any number of readers (the dashboard, a second
terminal) read a consistent snapshot without blocking it. Every op is committed in its
own short transaction before the call returns, so whatever a training process logged
before it was killed is in the file: a SIGKILL loses at most the op being written.
``synchronous=NORMAL`` keeps commits cheap (no fsync per step); it can lose the last
commits on a power cut, never on a process crash.

Metrics are stored long (one row per run, metric, step) so that reading one curve is
an index range scan, and a value logged twice at the same step replaces the first
(which also makes HTTP retries harmless). Batches posted over HTTP carry an id that is
recorded in the same transaction, so a batch re-sent after a lost reply is applied once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from posttrain.runs import tiles
from posttrain.runs.ops import (
    LOST_AFTER_SECONDS,
    OpWriter,
    RunStillAlive,
    RunStoreError,
    check_run_name,
    validate_ops,
)

SCHEMA_VERSION = 2  # 2: metric_tiles (posttrain.runs.tiles)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY,
    config TEXT NOT NULL DEFAULT '{}',
    summary TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'running',
    started REAL, updated REAL, finished REAL,
    last_step INTEGER, total_steps INTEGER, eta REAL
);
CREATE TABLE IF NOT EXISTS metric_names (
    run TEXT NOT NULL, name TEXT NOT NULL, PRIMARY KEY (run, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metrics (
    run TEXT NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL, value REAL NOT NULL,
    time REAL, PRIMARY KEY (run, name, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, step INTEGER, time REAL, text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_run ON notes (run, id);
CREATE TABLE IF NOT EXISTS alarms (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, kind TEXT NOT NULL, step INTEGER, time REAL,
    message TEXT NOT NULL, details TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS alarms_by_run ON alarms (run, id);
CREATE TABLE IF NOT EXISTS samples (
    run TEXT NOT NULL, source TEXT NOT NULL, step INTEGER NOT NULL, time REAL,
    rows TEXT NOT NULL, PRIMARY KEY (run, source, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ingested_batches (id TEXT PRIMARY KEY, time REAL NOT NULL);
"""
# the tables holding a run's rows besides `runs` (a re-created or deleted run loses them)
RUN_TABLES = ("metrics", "metric_tiles", "metric_names", "notes", "alarms", "samples")
# batch ids older than this are forgotten: a retry never comes a day late
_BATCH_MEMORY_SECONDS = 86_400.0
BUSY_TIMEOUT_MS = 10_000


def headline_delta(summary: dict[str, Any]) -> float | None:
    """The one number the run list shows for a finished run: its paired delta.

    Read from ``summary["headline_delta"]``, else ``summary["delta"]`` when it is a
    number, else ``summary["delta"]["delta"]`` (a ``DeltaReport.to_dict()``); None if absent.
    """
    for value in (summary.get("headline_delta"), summary.get("delta")):
        if isinstance(value, dict):
            value = value.get("delta")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def base_model(config: dict[str, Any]) -> str | None:
    """The run's base model: ``config["base_model"]``, else ``config["settings"]["base_model"]``
    (the recipes' layout); None when neither is a string."""
    settings = config.get("settings")
    for value in (config.get("base_model"),
                  settings.get("base_model") if isinstance(settings, dict) else None):
        if isinstance(value, str):
            return value
    return None


def _verdict(summary: dict[str, Any]) -> str | None:
    delta = summary.get("delta")
    verdict = delta.get("verdict") if isinstance(delta, dict) else summary.get("verdict")
    return verdict if isinstance(verdict, str) else None


class SqliteRunStore(OpWriter):
    """Run store on one SQLite file; safe for one writer and many readers across processes.

    Write methods come from ``OpWriter`` (``create_run``, ``log_metrics``, ...); each
    commits before returning. A ``running`` run whose last write is older than
    ``lost_after_seconds`` is read back with status ``lost`` (its writer sends heartbeats,
    so silence means the process is gone). Read methods (``list_runs``, ``get_run``,
    ``metric_names``, ``metric_series``) open a short-lived connection per call, so the
    object can be shared by a threaded HTTP server.
    """

    def __init__(self, path: str | Path, *, lost_after_seconds: float = LOST_AFTER_SECONDS) -> None:
        self.path = Path(path)
        self.lost_after_seconds = lost_after_seconds
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._writer = self._connect()
        mode = self._writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RunStoreError(f"{self.path}: SQLite could not switch to WAL mode (got {mode})")
        version = self._writer.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RunStoreError(
                f"{self.path}: run store schema {version} is newer than this posttrain "
                f"understands ({SCHEMA_VERSION}); upgrade posttrain or use another file"
            )
        self._writer.executescript(_SCHEMA + tiles.SCHEMA)
        if version < SCHEMA_VERSION:
            # a store written before tiles existed gets them once, in one transaction
            with self._lock:
                cursor = self._writer.cursor()
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    tiles.backfill(cursor)
                    cursor.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    cursor.execute("COMMIT")
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
            check_same_thread=False,
        )
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        connection = self._connect()
        try:
            yield connection
        finally:
            connection.close()

    # --- writing ---------------------------------------------------------------------

    def submit(self, op: dict[str, Any]) -> None:
        """Apply one op now (see ``posttrain.runs.ops`` for the op format)."""
        self.apply([op])

    def apply(self, ops: Sequence[dict[str, Any]], batch_id: str | None = None) -> int:
        """Validate then apply ``ops`` in one transaction; returns how many were applied.

        Nothing is applied when any op is invalid (``RunStoreError`` names it). A batch
        whose ``batch_id`` was already applied is skipped and 0 is returned.
        """
        checked = validate_ops(ops)
        now = time.time()
        with self._lock:
            cursor = self._writer.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                if batch_id is not None:
                    seen = cursor.execute(
                        "SELECT 1 FROM ingested_batches WHERE id = ?", (batch_id,)
                    ).fetchone()
                    if seen:
                        cursor.execute("ROLLBACK")
                        return 0
                    cursor.execute("DELETE FROM ingested_batches WHERE time < ?",
                                   (now - _BATCH_MEMORY_SECONDS,))
                    cursor.execute("INSERT INTO ingested_batches (id, time) VALUES (?, ?)",
                                   (batch_id, now))
                for op in checked:
                    # a heartbeat is stamped on arrival: liveness is judged by this clock,
                    # whatever the sender's clock says
                    stamped = op["time"] is not None and op["op"] != "heartbeat"
                    _apply_one(cursor, op, op["time"] if stamped else now)
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        return len(checked)

    def close(self) -> None:
        """Close the writer connection (reads still open their own)."""
        with self._lock:
            self._writer.close()

    def __enter__(self) -> SqliteRunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reading ---------------------------------------------------------------------

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first: name, status, base_model (from the config), started,
        updated, finished (epoch seconds), last_step, total_steps, eta (seconds),
        headline_delta and verdict (from the summary, None while running)."""
        with self._reader() as connection:
            rows = connection.execute(
                "SELECT name, status, config, summary, started, updated, finished, last_step,"
                " total_steps, eta FROM runs ORDER BY started DESC, name"
            ).fetchall()
        runs = []
        now = time.time()
        for name, status, config, summary, started, updated, finished, step, total, eta in rows:
            config, summary = json.loads(config), json.loads(summary)
            runs.append({
                "name": name, "status": self._status(status, updated, now),
                "base_model": base_model(config),
                "started": started, "updated": updated, "finished": finished,
                "last_step": step, "total_steps": total, "eta": eta,
                "headline_delta": headline_delta(summary), "verdict": _verdict(summary),
            })
        return runs

    def get_run(self, name: str) -> dict[str, Any] | None:
        """One run in full (config, summary, progress, notes, alarms, metric names, the
        checks that kept graded replies), or None."""
        check_run_name(name)
        with self._reader() as connection:
            row = connection.execute(
                "SELECT status, config, summary, started, updated, finished, last_step,"
                " total_steps, eta FROM runs WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return None
            notes = connection.execute(
                "SELECT step, time, text FROM notes WHERE run = ? ORDER BY id", (name,)
            ).fetchall()
            alarms = connection.execute(
                "SELECT kind, step, time, message, details FROM alarms WHERE run = ? ORDER BY id",
                (name,),
            ).fetchall()
            names = self._metric_names(connection, name)
            checks = self._sample_checks(connection, name)
        status, config, summary, started, updated, finished, step, total, eta = row
        return {
            "name": name, "status": self._status(status, updated, time.time()),
            "config": json.loads(config),
            "summary": json.loads(summary), "started": started, "updated": updated,
            "finished": finished,
            "progress": {"step": step, "total": total, "eta": eta},
            "notes": [{"step": s, "time": t, "text": text} for s, t, text in notes],
            "alarms": [
                {"kind": kind, "step": s, "time": t, "message": message,
                 "details": json.loads(details)}
                for kind, s, t, message, details in alarms
            ],
            "metric_names": names,
            "sample_checks": checks,
        }

    def _status(self, stored: str, updated: float | None, now: float) -> str:
        # "lost" is never stored: a run that starts writing again reads "running" again
        if stored == "running" and updated is not None and now - updated > self.lost_after_seconds:
            return "lost"
        return stored

    def delete_run(self, name: str, *, force: bool = False) -> bool:
        """Forget run ``name``: its record, curves, notes and alarms. Returns False when
        there was no such run.

        A run that is still alive (``running`` with a recent heartbeat) is refused with
        ``RunStillAlive`` unless ``force``: its next write would bring it back half-empty.
        The run folder on disk is not touched (``posttrain runs delete`` removes it too).
        """
        check_run_name(name)
        with self._lock:
            cursor = self._writer.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                row = cursor.execute(
                    "SELECT status, updated FROM runs WHERE name = ?", (name,)
                ).fetchone()
                if row is None:
                    cursor.execute("ROLLBACK")
                    return False
                if not force and self._status(row[0], row[1], time.time()) == "running":
                    raise RunStillAlive(
                        f"run {name!r} is still running (last heard from "
                        f"{time.time() - (row[1] or 0):.0f} s ago); stop it first (Ctrl-C), "
                        f"wait until it shows as lost, or force the deletion"
                    )
                for table in RUN_TABLES:
                    cursor.execute(f"DELETE FROM {table} WHERE run = ?", (name,))
                cursor.execute("DELETE FROM runs WHERE name = ?", (name,))
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        return True

    def sample_checks(self, run: str) -> list[dict[str, Any]]:
        """The checks that kept graded replies: ``[{"source", "step", "time", "count"}]``
        in step order (``monitor``: holdout replies; ``rollouts``: training replies)."""
        check_run_name(run)
        with self._reader() as connection:
            return self._sample_checks(connection, run)

    @staticmethod
    def _sample_checks(connection: sqlite3.Connection, run: str) -> list[dict[str, Any]]:
        rows = connection.execute(
            "SELECT source, step, time, json_array_length(rows) FROM samples WHERE run = ?"
            " ORDER BY step, source", (run,)).fetchall()
        return [{"source": source, "step": step, "time": moment, "count": count}
                for source, step, moment, count in rows]

    def sample_rows(self, run: str, source: str, step: int) -> list[dict[str, Any]] | None:
        """The graded replies kept for (``source``, ``step``), or None."""
        check_run_name(run)
        with self._reader() as connection:
            row = connection.execute(
                "SELECT rows FROM samples WHERE run = ? AND source = ? AND step = ?",
                (run, source, step)).fetchone()
        return None if row is None else json.loads(row[0])

    @staticmethod
    def _metric_names(connection: sqlite3.Connection, run: str) -> list[str]:
        rows = connection.execute(
            "SELECT name FROM metric_names WHERE run = ? ORDER BY name", (run,)
        ).fetchall()
        return [name for (name,) in rows]

    def metric_names(self, run: str) -> list[str]:
        """Names of every metric logged for ``run``, sorted."""
        check_run_name(run)
        with self._reader() as connection:
            return self._metric_names(connection, run)

    def metric_series(self, run: str, metric: str, *, max_points: int | None = None,
                      after_step: int | None = None) -> dict[str, Any]:
        """One curve: ``{"name", "steps", "values", "times", "count", "downsampled"}``.

        ``count`` is how many points are stored (after ``after_step`` when given: only
        steps strictly greater, for incremental polling). With ``max_points`` the points
        are thinned to at most that many inside SQLite (``_thinned_rows``: each step range
        keeps its min and max, plus the first and last point; from 4 points on, the
        curve's own min and max always survive, under 4 only the ends do). An unknown
        metric gives empty lists.
        """
        check_run_name(run)
        where = "run = ? AND name = ?" + (" AND step > ?" if after_step is not None else "")
        arguments: list[Any] = [run, metric] + ([after_step] if after_step is not None else [])
        with self._reader() as connection:
            if after_step is None:  # a whole curve: counted from its tiles, no scan
                count, low, high = tiles.curve_extent(connection, run, metric)
            else:
                count, low, high = connection.execute(
                    f"SELECT count(*), min(step), max(step) FROM metrics WHERE {where}",
                    arguments).fetchone()
            if max_points is None or count <= max_points:
                rows = connection.execute(
                    f"SELECT step, value, time FROM metrics WHERE {where} ORDER BY step",
                    arguments).fetchall()
            else:
                # a whole long curve: from its tiles; a tail (after_step) or a short one:
                # from the points
                from_tiles = None if after_step is not None else tiles.thinned_from_tiles(
                    connection, run, metric, low, high, max_points)
                rows = from_tiles if from_tiles is not None else _thinned_rows(
                    connection, where, arguments, low, high, max_points)
        return {
            "name": metric,
            "steps": [step for step, _, _ in rows],
            "values": [value for _, value, _ in rows],
            "times": [moment for _, _, moment in rows],
            "count": count,
            "downsampled": len(rows) < count,
        }


def _thinned_rows(connection: sqlite3.Connection, where: str, arguments: list[Any],
                  low: int, high: int, max_points: int) -> list[tuple[Any, ...]]:
    """At most ``max_points`` rows of a curve, thinned inside SQLite: the steps from ``low``
    to ``high`` are cut into equal ranges and each keeps the row of its smallest and of
    its largest value (spikes and dips survive), plus the first and the last row.

    Done in SQL so that a 100,000-point curve never crosses into Python: SQLite returns
    the step of the row holding a bucket's min() or max() as a bare column."""
    if max_points == 1:
        return connection.execute(
            f"SELECT step, value, time FROM metrics WHERE {where} AND step = ?",
            [*arguments, high]).fetchall()
    buckets = (max_points - 2) // 2
    if buckets == 0:
        return connection.execute(
            f"SELECT step, value, time FROM metrics WHERE {where} AND step IN (?, ?) "
            "ORDER BY step", [*arguments, low, high]).fetchall()
    width = (high - low + 1) / buckets  # exactly `buckets` ranges cover low..high
    bucket = "CAST((step - ?) / ? AS INTEGER)"
    picks = " UNION ".join(
        f"SELECT step FROM (SELECT {bucket} AS b, step, {pick}(value) FROM metrics "
        f"WHERE {where} GROUP BY b)" for pick in ("min", "max"))
    query = (f"SELECT step, value, time FROM metrics WHERE {where} AND step IN "
             f"({picks} UNION SELECT ? UNION SELECT ?) ORDER BY step")
    parameters = [*arguments, *(([low, width, *arguments]) * 2), low, high]
    return connection.execute(query, parameters).fetchall()


def _ensure_run(cursor: sqlite3.Cursor, run: str, moment: float) -> None:
    # an op for a run never created (its create was lost) still lands somewhere visible
    cursor.execute(
        "INSERT OR IGNORE INTO runs (name, status, started, updated) VALUES (?, 'running', ?, ?)",
        (run, moment, moment),
    )


def _apply_one(cursor: sqlite3.Cursor, op: dict[str, Any], moment: float) -> None:
    run, kind = op["run"], op["op"]
    if kind == "create":
        for table in RUN_TABLES:
            cursor.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
        cursor.execute(
            "INSERT OR REPLACE INTO runs (name, config, summary, status, started, updated)"
            " VALUES (?, ?, '{}', 'running', ?, ?)",
            (run, json.dumps(op["config"]), moment, moment),
        )
        return
    if kind == "heartbeat":
        # only a live record is refreshed: a beat never resurrects a deleted or finished run
        cursor.execute("UPDATE runs SET updated = max(coalesce(updated, 0), ?)"
                       " WHERE name = ? AND status = 'running'", (moment, run))
        return
    _ensure_run(cursor, run, moment)
    if kind == "metrics":
        step, values = op["step"], op["metrics"]
        for name, value in values.items():
            replaced = cursor.execute(
                "SELECT 1 FROM metrics WHERE run = ? AND name = ? AND step = ?",
                (run, name, step)).fetchone() is not None
            cursor.execute(
                "INSERT OR REPLACE INTO metrics (run, name, step, value, time)"
                " VALUES (?, ?, ?, ?, ?)", (run, name, step, value, moment))
            tiles.record_point(cursor, run, name, step, value, moment, replaced)
        cursor.executemany(
            "INSERT OR IGNORE INTO metric_names (run, name) VALUES (?, ?)",
            [(run, name) for name in values],
        )
        cursor.execute(
            "UPDATE runs SET last_step = max(coalesce(last_step, -1), ?), updated = ?"
            " WHERE name = ?", (step, moment, run),
        )
    elif kind == "progress":
        cursor.execute(
            "UPDATE runs SET last_step = max(coalesce(last_step, -1), ?),"
            " total_steps = coalesce(?, total_steps), eta = ?, updated = ? WHERE name = ?",
            (op["step"], op["total"], op["eta"], moment, run),
        )
    elif kind == "samples":
        cursor.execute(
            "INSERT OR REPLACE INTO samples (run, source, step, time, rows) VALUES (?, ?, ?, ?, ?)",
            (run, op["source"], op["step"], moment, json.dumps(op["rows"])))
        cursor.execute("UPDATE runs SET updated = ? WHERE name = ?", (moment, run))
    elif kind == "note":
        cursor.execute("INSERT INTO notes (run, step, time, text) VALUES (?, ?, ?, ?)",
                       (run, op["step"], moment, op["text"]))
        cursor.execute("UPDATE runs SET updated = ? WHERE name = ?", (moment, run))
    elif kind == "alarm":
        cursor.execute(
            "INSERT INTO alarms (run, kind, step, time, message, details)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run, op["kind"], op["step"], moment, op["message"], json.dumps(op["details"])),
        )
        cursor.execute("UPDATE runs SET updated = ? WHERE name = ?", (moment, run))
    elif kind == "finish":
        (old,) = cursor.execute("SELECT summary FROM runs WHERE name = ?", (run,)).fetchone()
        summary = {**json.loads(old), **op["summary"]}
        cursor.execute(
            "UPDATE runs SET status = ?, summary = ?, finished = ?, updated = ?, eta = NULL"
            " WHERE name = ?", (op["status"], json.dumps(summary), moment, moment, run),
        )
