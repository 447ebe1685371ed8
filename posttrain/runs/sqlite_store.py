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

import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from posttrain.errors import PosttrainError
from posttrain.runs import tiles
from posttrain.runs.ops import (
    LOST_AFTER_SECONDS,
    DamagedStore,
    OpWriter,
    RunStillAlive,
    RunStoreError,
    check_run_name,
    validate_ops,
)

P = ParamSpec("P")
R = TypeVar("R")

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


def is_damage(error: sqlite3.DatabaseError) -> bool:
    """Is this SQLite error a damaged file (not a busy lock, a full disk or a bad query)?"""
    if type(error) is sqlite3.DatabaseError:  # "file is not a database", "... malformed"
        return True
    text = str(error).lower()
    return any(sign in text for sign in ("malformed", "not a database", "could not decode"))


@functools.cache  # the schema is fixed: read once per process, not at every open
def _expected_columns() -> dict[str, frozenset[str]]:
    """Every table's columns as the schema makes them (read from a scratch database)."""
    scratch = sqlite3.connect(":memory:")
    try:
        scratch.executescript(_SCHEMA + tiles.SCHEMA)
        tables = [row[0] for row in scratch.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: frozenset(row[1] for row in scratch.execute(
                    f"PRAGMA table_info({table})")) for table in tables}
    finally:
        scratch.close()


def missing_columns(connection: sqlite3.Connection) -> list[str]:
    """``table.column`` names the schema makes and this file's tables lack (damage to
    the schema text itself: SQLite then reads the file as a different database)."""
    missing = []
    for table, columns in _expected_columns().items():
        have = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
        if have:  # a table not made yet is made by the schema script
            missing += [f"{table}.{column}" for column in sorted(columns - have)]
    return missing


def damaged_message(path: Path, error: Exception) -> str:
    """What to tell a user whose store file is damaged: which file, and how to recover."""
    backups = sorted(path.parent.glob(f"{path.name}.v*.bak"))
    kept = f"; a copy made before the last upgrade is {backups[-1]}" if backups else ""
    aside = path.parent / "damaged"
    return (f"the run store {path} is damaged ({error}). To recover, move it aside with its "
            f"-wal and -shm files (mkdir {aside} && mv {path}* {aside}/); posttrain then "
            f"starts a new, empty store. Every run's folder keeps its files (config.json, "
            f"metrics.jsonl, summary.json), and `sqlite3 {aside / path.name} .recover` may "
            f"salvage the records{kept}")


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


def _damage_checked(method: Callable[Concatenate[SqliteRunStore, P], R]
                    ) -> Callable[Concatenate[SqliteRunStore, P], R]:
    """A read method whose damaged-file errors (also those met after the connection is
    closed, parsing what was read) become ``DamagedStore``."""
    @functools.wraps(method)
    def checked(self: SqliteRunStore, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._intact():
            return method(self, *args, **kwargs)
    return checked


class SqliteRunStore(OpWriter):
    """Run store on one SQLite file; safe for one writer and many readers across processes.

    Write methods come from ``OpWriter`` (``create_run``, ``log_metrics``, ...); each
    commits before returning. A ``running`` run whose last write is older than
    ``lost_after_seconds`` is read back with status ``lost`` (its writer sends heartbeats,
    so silence means the process is gone). Read methods (``list_runs``, ``get_run``,
    ``metric_names``, ``metric_series``) open a short-lived connection per call, so the
    object can be shared by a threaded HTTP server.
    """

    def __init__(self, path: str | Path, *, lost_after_seconds: float = LOST_AFTER_SECONDS,
                 tolerate_damage: bool = False) -> None:
        self.path = Path(path)
        # a damaged file (with tolerate_damage, for the dashboard): every call raises this
        # until the file is moved aside or repaired, when the store opens again by itself
        self.damage: DamagedStore | None = None
        self._reopen_lock = threading.Lock()
        self.lost_after_seconds = lost_after_seconds
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunStoreError(f"cannot create the runs folder {self.path.parent} "
                                f"({error.strerror or error})") from None
        self._lock = threading.Lock()
        try:
            self._open()
        except DamagedStore as error:
            if not tolerate_damage:
                raise
            self.damage = error
            # a closed stand-in for the writer, so close() has nothing left to do
            self._writer = sqlite3.connect(":memory:", check_same_thread=False)
            self._writer.close()

    def _open(self) -> None:
        """Connect the writer and bring the schema up to date (migrating a copy-kept file)."""
        try:
            with self._damage_named():
                writer = self._connect()
        except sqlite3.Error as error:
            raise RunStoreError(f"cannot open the run store {self.path} ({error}): check that "
                                f"{self.path.parent} is a folder you can write to") from None
        self._writer = writer
        try:
            with self._damage_named():
                self._open_schema()
        except BaseException:
            writer.close()
            raise

    def _reopen(self) -> None:
        """Try the file again after damage (it may have been moved aside or restored)."""
        with self._reopen_lock:
            if self.damage is None:
                return
            try:
                self._open()
            except DamagedStore as error:
                self.damage = error
                raise
            self.damage = None

    def _open_schema(self) -> None:
        mode = self._writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RunStoreError(f"{self.path}: SQLite could not switch to WAL mode (got {mode})")
        version = self._writer.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RunStoreError(
                f"{self.path}: run store schema {version} is newer than this posttrain "
                f"understands ({SCHEMA_VERSION}); upgrade posttrain or use another file"
            )
        if version < SCHEMA_VERSION and self._has_tables():
            self._back_up(version)
        self._writer.executescript(_SCHEMA + tiles.SCHEMA)
        missing = missing_columns(self._writer)
        if missing:
            raise DamagedStore(damaged_message(
                self.path, f"its tables lack {', '.join(missing[:5])}"))
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

    def _has_tables(self) -> bool:
        return self._writer.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0

    def backup_path(self, version: int) -> Path:
        """Where the copy of a schema-``version`` store is kept before it is migrated."""
        return self.path.with_name(f"{self.path.name}.v{version}.bak")

    def _back_up(self, version: int) -> None:
        """Copy the store aside before a migration rewrites it (SQLite's online backup: a
        consistent copy even while another process writes). An existing copy is kept."""
        target = self.backup_path(version)
        if target.exists():
            return
        partial = target.with_name(target.name + ".partial")
        copy = sqlite3.connect(partial)
        try:
            self._writer.backup(copy)
        finally:
            copy.close()
        partial.replace(target)

    @contextmanager
    def _intact(self) -> Iterator[None]:
        """Raise the known damage (unless the file reads again now), and name new damage."""
        if self.damage is not None:
            self._reopen()
        with self._damage_named():
            yield

    @contextmanager
    def _damage_named(self) -> Iterator[None]:
        """Turn a damaged file's errors into ``DamagedStore``, which says which file and
        how to recover (instead of a traceback from deep in a command). SQLite's "not a
        database" / "malformed" are damage outright; any other unexpected error (a cell of
        garbage read back as text or JSON, a row that should be there and is not) is
        damage when SQLite's own ``quick_check`` of the file fails too."""
        try:
            yield
        except PosttrainError:
            raise
        except sqlite3.DatabaseError as error:
            # a failed ROLLBACK after the damage hides it: look at what it interrupted too
            cause: BaseException | None = error
            while cause is not None and not (isinstance(cause, sqlite3.DatabaseError)
                                             and is_damage(cause)):
                cause = cause.__context__
            if cause is not None:
                raise DamagedStore(damaged_message(self.path, cause)) from None
            if not self._fails_check():
                raise  # busy, disk full, read-only, a closed connection: the file is fine
            raise DamagedStore(damaged_message(self.path, error)) from None
        except Exception as error:
            if self._fails_check() or isinstance(error, (UnicodeDecodeError,
                                                         json.JSONDecodeError)):
                raise DamagedStore(damaged_message(self.path, error)) from None
            raise

    def _fails_check(self) -> bool:
        """Does SQLite's ``quick_check`` find the file damaged (or cannot it even run)?
        Also true when our tables lack a column they were made with (a damaged schema)."""
        try:
            connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000)
            try:
                result = connection.execute("PRAGMA quick_check").fetchall()
                return result != [("ok",)] or bool(missing_columns(connection))
            finally:
                connection.close()
        except sqlite3.OperationalError:
            return False  # cannot open, busy, locked: a state of the disk, not damage
        except Exception:  # e.g. a schema SQLite reads back as bytes that are not UTF-8
            return True

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
        with self._intact():
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
        with self._intact(), self._lock:
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

    @_damage_checked
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

    @_damage_checked
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
        with self._intact(), self._lock:
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

    @_damage_checked
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

    @_damage_checked
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

    @_damage_checked
    def metric_names(self, run: str) -> list[str]:
        """Names of every metric logged for ``run``, sorted."""
        check_run_name(run)
        with self._reader() as connection:
            return self._metric_names(connection, run)

    @_damage_checked
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
