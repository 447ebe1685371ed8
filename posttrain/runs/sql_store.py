"""What every SQL run store does, whatever the database: apply ops, delete a run, read.

``SqlRunStore`` holds the logic once; a back end (``SqliteRunStore``, ``PostgresRunStore``)
says how to open a write transaction (``_write``) and a read connection (``_reader``),
each yielding a ``sql.Db``, and may turn its driver's errors into ours (``_intact``).
The statements themselves live in ``posttrain.runs.sql``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Concatenate, ParamSpec, TypeVar

from posttrain.access import ADMIN, Caller
from posttrain.runs import sql
from posttrain.runs.ops import LOST_AFTER_SECONDS, OpWriter, check_run_name, validate_ops

P = ParamSpec("P")
R = TypeVar("R")


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


def stored_object(text: Any) -> dict[str, Any]:
    """A run's stored config, summary or alarm details as a dict. A shared store (a
    PostgreSQL database other programs write to) may hold anything in those columns: a row
    whose value is not a JSON object reads as an empty one, so one hostile row cannot break
    the run list or a run's page for everyone."""
    try:
        value = json.loads(text) if isinstance(text, (str, bytes)) else text
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _verdict(summary: dict[str, Any]) -> str | None:
    delta = summary.get("delta")
    verdict = delta.get("verdict") if isinstance(delta, dict) else summary.get("verdict")
    return verdict if isinstance(verdict, str) else None


def checked_read(method: Callable[Concatenate[SqlRunStore, P], R]
                 ) -> Callable[Concatenate[SqlRunStore, P], R]:
    """A read method whose store errors (also those met after the connection is closed,
    parsing what was read) go through the back end's ``_intact``."""
    @functools.wraps(method)
    def checked(self: SqlRunStore, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._intact():
            return method(self, *args, **kwargs)
    return checked


class SqlRunStore(OpWriter):
    """The run store's behaviour on any SQL database (see the module's docstring).

    Write methods come from ``OpWriter`` (``create_run``, ``log_metrics``, ...) through
    ``apply``. A ``running`` run whose last write is older than ``lost_after_seconds`` is
    read back with status ``lost`` (its writer sends heartbeats, so silence means the
    process is gone). ``location`` names the store in messages (a file, or a URL without
    its password).
    """

    dialect: sql.Dialect = sql.SQLITE
    location: str = ""
    lost_after_seconds: float = LOST_AFTER_SECONDS

    # --- what a back end provides ------------------------------------------------------

    def _write(self) -> AbstractContextManager[sql.Db]:  # pragma: no cover - abstract
        """A write transaction: committed when the block ends, rolled back on error."""
        raise NotImplementedError

    def _read_connection(self) -> Any:  # pragma: no cover - abstract
        """A new connection for one read (closed by ``_reader``)."""
        raise NotImplementedError

    @contextmanager
    def _reader(self) -> Iterator[sql.Db]:
        """A short-lived connection for reads, closed after the block."""
        with self._intact():
            connection = self._read_connection()
            try:
                yield sql.Db(connection.cursor(), self.dialect)
            finally:
                connection.close()

    def _intact(self) -> AbstractContextManager[None]:
        """Where the back end turns its driver's errors into ``RunStoreError``s."""
        return nullcontext()

    # --- writing -----------------------------------------------------------------------

    def submit(self, op: dict[str, Any]) -> None:
        """Apply one op now (see ``posttrain.runs.ops`` for the op format)."""
        self.apply([op])

    def apply(self, ops: Sequence[dict[str, Any]], batch_id: str | None = None,
              owner: str | None = None, *, caller: Caller = ADMIN) -> int:
        """Validate then apply ``ops`` in one transaction; returns how many were applied.

        Nothing is applied when any op is invalid (``RunStoreError`` names it) or when
        ``caller``, a tokens-file name, writes to a run it did not create (``NotYours``).
        A batch whose ``batch_id`` was already applied is skipped and 0 is returned. A run
        the ops create records ``owner`` (the tokens-file name that sent them).
        """
        return self._apply_checked(validate_ops(ops), batch_id, owner, caller)

    def _apply_checked(self, checked: list[dict[str, Any]], batch_id: str | None,
                       owner: str | None = None, caller: Caller = ADMIN) -> int:
        now = time.time()
        with self._intact(), self._write() as db:
            sql.check_writes(db, checked, caller)
            if batch_id is not None and not sql.claim_batch(db, batch_id, now):
                return 0
            sql.apply_ops(db, checked, now, owner)
        return len(checked)

    def delete_run(self, name: str, *, force: bool = False, caller: Caller = ADMIN) -> bool:
        """Forget run ``name``: its record, curves, notes and alarms. Returns False when
        there was no such run.

        A run that is still alive (``running`` with a recent heartbeat) is refused with
        ``RunStillAlive`` unless ``force``: its next write would bring it back half-empty.
        A ``caller`` from a tokens file deletes only the runs it created (``NotYours``).
        The run folder on disk is not touched (``posttrain runs delete`` removes it too).
        """
        check_run_name(name)
        with self._intact(), self._write() as db:
            return sql.delete_run_rows(db, name, force=force,
                                       lost_after_seconds=self.lost_after_seconds,
                                       caller=caller)

    def __enter__(self) -> SqlRunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reading -----------------------------------------------------------------------

    def _status(self, stored: str, updated: float | None, now: float) -> str:
        # "lost" is never stored: a run that starts writing again reads "running" again
        return "lost" if sql.lost(stored, updated, now, self.lost_after_seconds) else stored

    @checked_read
    def list_runs(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every run (the newest ``limit`` of them), newest first: name, owner, status,
        base_model (from the config), started, updated, finished (epoch seconds),
        last_step, total_steps, eta (seconds), headline_delta and verdict (from the
        summary, None while running)."""
        newest = "" if limit is None else " ORDER BY coalesce(started, 0) DESC LIMIT ?"
        with self._reader() as db:
            rows = db.all("SELECT name, status, config, summary, started, updated, finished,"
                          " last_step, total_steps, eta, owner FROM runs" + newest,
                          () if limit is None else (limit,))
        # ordered here, not in SQL: names compare by code point whatever the collation
        rows.sort(key=lambda row: (-(row[4] if row[4] is not None else float("-inf")),
                                   row[0]))
        runs = []
        now = time.time()
        for (name, status, config, summary, started, updated, finished, step, total, eta,
             owner) in rows:
            config, summary = stored_object(config), stored_object(summary)
            runs.append({
                "owner": owner,
                "name": name, "status": self._status(status, updated, now),
                "base_model": base_model(config),
                "started": started, "updated": updated, "finished": finished,
                "last_step": step, "total_steps": total, "eta": eta,
                "headline_delta": headline_delta(summary), "verdict": _verdict(summary),
            })
        return runs

    @checked_read
    def get_run(self, name: str, limit: int | None = None) -> dict[str, Any] | None:
        """One run in full (owner, config, summary, progress, notes, alarms, metric names, the
        checks that kept graded replies), or None. ``limit``: at most that many of each
        list (the latest notes and alarms, the first names and checks), and ``cut``
        names the lists that held more."""
        check_run_name(name)
        most = "" if limit is None else f" LIMIT {int(limit) + 1}"
        with self._reader() as db:
            row = db.one("SELECT status, config, summary, started, updated, finished,"
                         " last_step, total_steps, eta, owner FROM runs WHERE name = ?",
                         (name,))
            if row is None:
                return None
            notes = db.all("SELECT step, time, text FROM notes WHERE run = ?"
                           " ORDER BY id DESC" + most, (name,))[::-1]
            alarms = db.all("SELECT kind, step, time, message, details FROM alarms"
                            " WHERE run = ? ORDER BY id DESC" + most, (name,))[::-1]
            names = self._metric_names(db, name, most)
            checks = self._sample_checks(db, name, most)
        cut = []
        if limit is not None:
            for what, items in (("notes", notes), ("alarms", alarms),
                                ("metric_names", names), ("sample_checks", checks)):
                if len(items) > limit:
                    cut.append(what)
            notes, alarms = notes[-limit:] if "notes" in cut else notes, \
                alarms[-limit:] if "alarms" in cut else alarms
            names, checks = names[:limit], checks[:limit]
        status, config, summary, started, updated, finished, step, total, eta, owner = row
        return {
            "name": name, "owner": owner,
            "status": self._status(status, updated, time.time()),
            "config": stored_object(config),
            "summary": stored_object(summary), "started": started, "updated": updated,
            "finished": finished,
            "progress": {"step": step, "total": total, "eta": eta},
            "notes": [{"step": s, "time": t, "text": text} for s, t, text in notes],
            "alarms": [
                {"kind": kind, "step": s, "time": t, "message": message,
                 "details": stored_object(details)}
                for kind, s, t, message, details in alarms
            ],
            "metric_names": names,
            "sample_checks": checks,
            **({"cut": cut} if cut else {}),
        }

    @checked_read
    def sample_checks(self, run: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The checks that kept graded replies: ``[{"source", "step", "time", "count"}]``
        in step order (``monitor``: holdout replies; ``rollouts``: training replies); the
        first ``limit`` of them."""
        check_run_name(run)
        most = "" if limit is None else f" LIMIT {int(limit)}"
        with self._reader() as db:
            return self._sample_checks(db, run, most)

    @staticmethod
    def _sample_checks(db: sql.Db, run: str, most: str = "") -> list[dict[str, Any]]:
        count = db.dialect.json_length.format("rows")
        rows = db.all(f"SELECT source, step, time, {count} FROM samples WHERE run = ?"
                      " ORDER BY step, source" + most, (run,))
        return [{"source": source, "step": step, "time": moment, "count": count}
                for source, step, moment, count in rows]

    @checked_read
    def sample_rows(self, run: str, source: str, step: int) -> list[dict[str, Any]] | None:
        """The graded replies kept for (``source``, ``step``), or None."""
        check_run_name(run)
        with self._reader() as db:
            row = db.one("SELECT rows FROM samples WHERE run = ? AND source = ? AND step = ?",
                         (run, source, step))
        return None if row is None else json.loads(row[0])

    @staticmethod
    def _metric_names(db: sql.Db, run: str, most: str = "") -> list[str]:
        # ordered in SQL only when cut (a collation may differ from code points there)
        order = " ORDER BY name" if most else ""
        return sorted(name for (name,) in db.all(
            "SELECT name FROM metric_names WHERE run = ?" + order + most, (run,)))

    @checked_read
    def metric_names(self, run: str, limit: int | None = None,
                     among: Sequence[str] | None = None) -> list[str]:
        """Names of every metric logged for ``run``, sorted: the first ``limit`` of them,
        or only those ``among`` the names given (one query either way)."""
        check_run_name(run)
        with self._reader() as db:
            if among is not None:
                if not among:
                    return []
                marks = ", ".join("?" * len(among))
                return sorted(name for (name,) in db.all(
                    f"SELECT name FROM metric_names WHERE run = ? AND name IN ({marks})",
                    (run, *among)))
            return self._metric_names(db, run, "" if limit is None else f" LIMIT {int(limit)}")

    @checked_read
    def metric_points(self, run: str, names: Sequence[str] | None = None, *,
                      limit: int) -> list[tuple[str, int, float, float]] | None:
        """Every point of ``run``'s metrics (``names``, default all) as ``(name, step,
        value, time)``, by name then step, in one query; None when there are more than
        ``limit`` (the caller says so instead of building an answer of any size)."""
        check_run_name(run)
        where, arguments = "run = ?", [run]
        if names is not None:
            if not names:
                return []
            where += f" AND name IN ({', '.join('?' * len(names))})"
            arguments += list(names)
        with self._reader() as db:
            rows = db.all(f"SELECT name, step, value, time FROM metrics WHERE {where}"
                          " ORDER BY name, step LIMIT ?", (*arguments, limit + 1))
        return None if len(rows) > limit else [tuple(row) for row in rows]

    @checked_read
    def metric_series(self, run: str, metric: str, *, max_points: int | None = None,
                      after_step: int | None = None) -> dict[str, Any]:
        """One curve: ``{"name", "steps", "values", "times", "count", "downsampled"}``.

        ``count`` is how many points are stored (after ``after_step`` when given: only
        steps strictly greater, for incremental polling). With ``max_points`` the points
        are thinned to at most that many inside the database (``sql.thinned_points``: each
        step range keeps its min and max, plus the first and last point; from 4 points on,
        the curve's own min and max always survive, under 4 only the ends do). An unknown
        metric gives empty lists.
        """
        check_run_name(run)
        where = "run = ? AND name = ?" + (" AND step > ?" if after_step is not None else "")
        arguments: list[Any] = [run, metric] + ([after_step] if after_step is not None else [])
        with self._reader() as db:
            if after_step is None:  # a whole curve: counted from its tiles, no scan
                count, low, high = sql.curve_extent(db, run, metric)
            else:
                count, low, high = db.one(
                    f"SELECT count(*), min(step), max(step) FROM metrics WHERE {where}",
                    arguments)
            if max_points is None or count <= max_points:
                rows = db.all(f"SELECT step, value, time FROM metrics WHERE {where}"
                              " ORDER BY step", arguments)
            else:
                # a whole long curve: from its tiles; a tail (after_step) or a short one:
                # from the points
                from_tiles = None if after_step is not None else sql.thinned_from_tiles(
                    db, run, metric, low, high, max_points)
                rows = from_tiles if from_tiles is not None else sql.thinned_points(
                    db, where, arguments, low, high, max_points)
        return {
            "name": metric,
            "steps": [step for step, _, _ in rows],
            "values": [value for _, value, _ in rows],
            "times": [moment for _, _, moment in rows],
            "count": count,
            "downsampled": len(rows) < count,
        }

