"""The write operations of the run store, as plain JSON records, and their validation.

Every write to a run (create, metrics, progress, note, alarm, finish) is one *op*: a dict
with ``op``, ``run`` and ``time`` plus the fields of its kind. The SQLite store applies
ops, the HTTP store posts them in batches, and the server checks a posted batch with
``validate_ops`` before applying any of it, so one definition serves all three.

| op         | fields                                                        |
|------------|---------------------------------------------------------------|
| `create`   | `config` (object)                                             |
| `metrics`  | `step` (int >= 0), `metrics` (object of finite numbers)       |
| `progress` | `step`, `total` (int or null), `eta` (seconds or null)        |
| `note`     | `text` (string), `step` (int or null)                         |
| `alarm`    | `kind` (string), `step`, `message` (string), `details` (object) |
| `finish`   | `status` (`done` / `failed` / `stopped`), `summary` (object)  |
| `heartbeat`| none: the training process is alive (sent every few seconds)  |
| `samples`  | `step`, `source` (`monitor` / `rollouts`), `rows` (list of objects, at most 64) |

A run whose status is ``running`` but whose last write (heartbeats included) is older than
``LOST_AFTER_SECONDS`` is read back as ``lost``: the process that trained it was killed
(SIGKILL, a crash, a lost machine) before it could write a final state.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.jsonl import to_jsonable

STATUSES = ("running", "done", "failed", "stopped", "lost")
FINISH_STATUSES = ("done", "failed", "stopped")
#: how often a live run handle says it is alive
HEARTBEAT_SECONDS = 15.0
#: a running run silent for this long (six missed heartbeats) is read back as ``lost``
LOST_AFTER_SECONDS = 90.0
OP_FIELDS: dict[str, tuple[str, ...]] = {
    "create": ("config",),
    "metrics": ("step", "metrics"),
    "progress": ("step", "total", "eta"),
    "note": ("text", "step"),
    "alarm": ("kind", "step", "message", "details"),
    "finish": ("status", "summary"),
    "heartbeat": (),
    "samples": ("step", "source", "rows"),
}
#: graded replies kept per (run, source, step): a view for people, bounded per check
MAX_SAMPLE_ROWS = 64
SAMPLE_SOURCES = ("monitor", "rollouts")
MAX_SAMPLES_CHARS = 1_000_000

MAX_RUN_NAME = 128
MAX_METRIC_NAME = 200
MAX_TEXT = 100_000

_RUN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class RunStoreError(PosttrainError, ValueError):
    """A run name, op or field the store cannot accept; the message says which and why."""


class RunStillAlive(RunStoreError):
    """The run is ``running`` with a fresh heartbeat, so it cannot be deleted yet."""


class NotYours(RunStoreError):
    """The caller's token did not create the run it wants to write to or delete."""

    http_status = 403


class StoreUnavailable(RunStoreError):
    """The store cannot be used now (its file is damaged, its server cannot be reached):
    the store's state, not the caller's input; the message names the store and what to do."""

    http_status = 503


class DamagedStore(StoreUnavailable):
    """The store's file is not a readable SQLite database (overwritten, truncated, cut
    by a full disk); the message names the file and how to recover."""


class StoreUnreachable(StoreUnavailable):
    """The store's database server does not answer (down, restarting, a lost connection)."""


#: the default store's file under the runs folder (``posttrain.runs.store``)
DB_FILENAME = "posttrain.db"
#: names a run folder may not take: the store's file and SQLite's files beside it (a run
#: named ``posttrain.db-wal`` would make a folder where SQLite keeps its write-ahead log)
RESERVED_RUN_NAMES = frozenset(
    DB_FILENAME + suffix for suffix in ("", "-wal", "-shm", "-journal"))


def check_run_name(name: object) -> str:
    """Return ``name`` if it is a safe run name, else raise ``RunStoreError``.

    A run name becomes a folder name (``runs/<name>/``) and a URL segment, so it may only
    hold letters, digits, ``-``, ``_`` and ``.``, must not start with a dot (no hidden
    folders, no ``..``) and is at most 128 characters. ``../x``, ``a/b`` and ``.hidden``
    are refused, and so are the store's own files (``posttrain.db``, ``posttrain.db-wal``,
    ...: ``RESERVED_RUN_NAMES``).
    """
    if not isinstance(name, str) or not name:
        raise RunStoreError(f"run name must be a non-empty string, got {name!r}")
    if len(name) > MAX_RUN_NAME:
        raise RunStoreError(f"run name is {len(name)} characters long; the limit is 128")
    if not _RUN_NAME.fullmatch(name) or name.startswith("."):
        raise RunStoreError(
            f"run name {name!r} is not allowed: use letters, digits, '-', '_' and '.', "
            "not starting with '.' (it becomes a folder name under the runs folder)"
        )
    if name.lower() in RESERVED_RUN_NAMES:
        raise RunStoreError(
            f"run name {name!r} is not allowed: it is the run store's own file in the runs "
            "folder; choose another name")
    return name



def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` as floats; everything else is dropped.

    Booleans, None, strings, NaN and infinities are dropped (a curve cannot draw them);
    numpy and 0-d torch scalars are read with ``.item()``.
    """
    cleaned: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(name, str) or not name:
            continue
        if not isinstance(value, numbers.Real) and hasattr(value, "item"):
            try:
                value = value.item()
            except (TypeError, ValueError, RuntimeError):
                continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        number = float(value)
        if math.isfinite(number):
            cleaned[name[:MAX_METRIC_NAME]] = number
    return cleaned


def _field_error(index: int, op: str, field: str, problem: str) -> RunStoreError:
    return RunStoreError(f"op {index} ({op}): field {field!r}: {problem}")


#: the largest step (or total) a run may record: every JSON reader holds it exactly, and
#: SQLite's 64-bit integers hold it (a larger one was a 500 from the store)
MAX_STEP = 2**53


def _check_step(index: int, op: str, value: Any, *, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        expected = "an integer from 0 to 2**53" + (" or null" if optional else "")
        raise _field_error(index, op, "step", f"expected {expected}, got {value!r}")
    return value


def _check_number(index: int, op: str, field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _field_error(index, op, field, f"expected a finite number or null, got {value!r}")
    return float(value)


#: how deep a config, summary or alarm details may nest (JSON readers recurse)
MAX_DEPTH = 64


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` cannot be stored as strict JSON (a non-finite number, a key that is
    not a string, nesting too deep, a type JSON does not have), or None."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"key {key!r} is not a string"
            problem = _json_problem(item, depth + 1)
            if problem:
                return f"{key}: {problem}" if depth < 8 else problem
        return None
    if isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            problem = _json_problem(item, depth + 1)
            if problem:
                return f"[{position}]: {problem}" if depth < 8 else problem
        return None
    return f"{type(value).__name__} is not a JSON value"


def _check_object(index: int, op: str, field: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _field_error(index, op, field, f"expected an object, got {type(value).__name__}")
    problem = _json_problem(value)
    if problem:  # stored as text and served to browsers: strict JSON only (no NaN)
        raise _field_error(index, op, field, problem)
    return value


def _check_text(index: int, op: str, field: str, value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise _field_error(index, op, field, f"expected a string, got {type(value).__name__}")
    if len(value) > limit:
        raise _field_error(index, op, field, f"{len(value)} characters; the limit is {limit}")
    return value


def validate_op(op: Any, index: int = 0) -> dict[str, Any]:
    """A checked, normalised copy of one op; raises ``RunStoreError`` naming op and field."""
    if not isinstance(op, dict):
        raise RunStoreError(f"op {index}: expected an object, got {type(op).__name__}")
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in OP_FIELDS:  # a list here was a TypeError
        raise RunStoreError(f"op {index}: unknown op {kind!r}; expected one of {list(OP_FIELDS)}")
    try:
        run = check_run_name(op.get("run"))
    except RunStoreError as error:
        raise RunStoreError(f"op {index} ({kind}): {error}") from None
    moment = _check_number(index, kind, "time", op.get("time"))
    checked: dict[str, Any] = {"op": kind, "run": run, "time": moment}
    if kind == "create":
        checked["config"] = _check_object(index, kind, "config", op.get("config"))
    elif kind == "metrics":
        checked["step"] = _check_step(index, kind, op.get("step"), optional=False)
        raw = _check_object(index, kind, "metrics", op.get("metrics"))
        for name, value in raw.items():
            if not name or len(name) > MAX_METRIC_NAME:
                raise _field_error(index, kind, "metrics", f"bad metric name {name!r}")
            _check_number(index, kind, f"metrics.{name}", value)
        checked["metrics"] = {
            name: float(value) for name, value in raw.items() if value is not None
        }
    elif kind == "progress":
        checked["step"] = _check_step(index, kind, op.get("step"), optional=False)
        total = op.get("total")
        checked["total"] = None if total is None else _check_step(
            index, kind, total, optional=False
        )
        checked["eta"] = _check_number(index, kind, "eta", op.get("eta"))
    elif kind == "note":
        checked["text"] = _check_text(index, kind, "text", op.get("text"))
        checked["step"] = _check_step(index, kind, op.get("step"), optional=True)
    elif kind == "alarm":
        checked["kind"] = _check_text(index, kind, "kind", op.get("kind"), limit=100)
        checked["step"] = _check_step(index, kind, op.get("step"), optional=True)
        checked["message"] = _check_text(index, kind, "message", op.get("message", ""))
        checked["details"] = _check_object(index, kind, "details", op.get("details"))
    elif kind == "heartbeat":
        pass  # the run name and time are all it carries
    elif kind == "samples":
        checked["step"] = _check_step(index, kind, op.get("step"), optional=False)
        source = op.get("source")
        if source not in SAMPLE_SOURCES:
            raise _field_error(index, kind, "source",
                               f"expected one of {list(SAMPLE_SOURCES)}, got {source!r}")
        checked["source"] = source
        rows = op.get("rows")
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise _field_error(index, kind, "rows", "expected a list of objects")
        if len(rows) > MAX_SAMPLE_ROWS:
            raise _field_error(index, kind, "rows",
                               f"{len(rows)} rows; at most {MAX_SAMPLE_ROWS} per check")
        problem = _json_problem(rows)
        if problem:
            raise _field_error(index, kind, "rows", problem)
        if sum(len(str(row)) for row in rows) > MAX_SAMPLES_CHARS:
            raise _field_error(index, kind, "rows",
                               f"over {MAX_SAMPLES_CHARS} characters; send shorter rows")
        checked["rows"] = rows
    else:  # finish
        status = op.get("status")
        if status not in FINISH_STATUSES:
            raise _field_error(
                index, kind, "status", f"expected one of {list(FINISH_STATUSES)}, got {status!r}"
            )
        checked["status"] = status
        checked["summary"] = _check_object(index, kind, "summary", op.get("summary"))
    return checked


def validate_ops(ops: Any) -> list[dict[str, Any]]:
    """Check a whole batch before any of it is applied; ``RunStoreError`` names the first bad op."""
    if not isinstance(ops, Sequence) or isinstance(ops, (str, bytes)):
        raise RunStoreError(f"'ops' must be a list, got {type(ops).__name__}")
    return [validate_op(op, index) for index, op in enumerate(ops)]


class OpWriter:
    """The write half of the run-store interface, built on one method: ``submit(op)``.

    Both back ends inherit it: the SQLite store applies each op at once, the HTTP store
    queues it for its sender thread. Timestamps are seconds since the epoch; None means
    "now" at the moment the store applies the op.
    """

    def submit(self, op: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def create_run(self, name: str, config: Mapping[str, Any],
                   started: float | None = None) -> None:
        """Start run ``name`` with its config (status ``running``); an earlier run of
        that name is replaced, like its run folder."""
        self.submit({"op": "create", "run": name, "config": to_jsonable(dict(config)),
                     "time": started})

    def log_metrics(self, name: str, step: int, metrics: Mapping[str, Any],
                    timestamp: float | None = None) -> None:
        """Record metric values at ``step``; a value already logged for (name, step) is replaced."""
        self.submit({"op": "metrics", "run": name, "step": step,
                     "metrics": clean_metrics(metrics), "time": timestamp})

    def set_progress(self, name: str, step: int, total: int | None = None,
                     eta_seconds: float | None = None, timestamp: float | None = None) -> None:
        """Record how far the run is: ``step`` of ``total``, ``eta_seconds`` left."""
        self.submit({"op": "progress", "run": name, "step": step, "total": total,
                     "eta": eta_seconds, "time": timestamp})

    def add_note(self, name: str, text: str, step: int | None = None,
                 timestamp: float | None = None) -> None:
        """Attach a line of text to the run (at ``step`` when given)."""
        self.submit({"op": "note", "run": name, "text": text, "step": step, "time": timestamp})

    def add_alarm(self, name: str, kind: str, step: int | None, message: str,
                  details: Mapping[str, Any] | None = None,
                  timestamp: float | None = None) -> None:
        """Record an alarm (``hack``, ``length``, ``guard``, ``divergence``, ...) at ``step``."""
        self.submit({"op": "alarm", "run": name, "kind": kind, "step": step, "message": message,
                     "details": to_jsonable(dict(details or {})), "time": timestamp})

    def finish_run(self, name: str, summary: Mapping[str, Any] | None = None,
                   status: str = "done", timestamp: float | None = None) -> None:
        """Mark the run ``done``, ``failed`` or ``stopped``; ``summary`` is merged into any
        earlier summary (top-level keys, later wins)."""
        self.submit({"op": "finish", "run": name, "status": status,
                     "summary": to_jsonable(dict(summary or {})), "time": timestamp})

    def log_samples(self, name: str, step: int, rows: Sequence[Mapping[str, Any]],
                    source: str = "monitor", timestamp: float | None = None) -> None:
        """Keep graded replies of a check at ``step`` (at most ``MAX_SAMPLE_ROWS``; a
        second set for the same step and source replaces the first)."""
        self.submit({"op": "samples", "run": name, "step": step, "source": source,
                     "rows": to_jsonable([dict(row) for row in rows][:MAX_SAMPLE_ROWS]),
                     "time": timestamp})

    def heartbeat(self, name: str, timestamp: float | None = None) -> None:
        """Say that the process writing run ``name`` is alive (a running run that stops
        sending these is read back as ``lost``)."""
        self.submit({"op": "heartbeat", "run": name, "time": timestamp})

    def close(self) -> None:
        """Release the store's resources (and, for HTTP, deliver what is queued)."""
