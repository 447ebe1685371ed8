"""The run store: where a training run's config, curves, progress, notes, alarms and
summary go while it trains, for the dashboard and the report to read.

One interface, three back ends:

- ``SqliteRunStore(path)``: one SQLite file, ``<runs root>/posttrain.db`` by default, WAL
  mode (one writer, many readers; what was logged before a crash stays logged).
- ``PostgresRunStore(url)``: a PostgreSQL database a team shares, chosen by ``--store
  postgresql://...`` or ``POSTTRAIN_STORE`` (``posttrain/runs/postgres_store.py``).
- ``HttpRunStore(server_url, token)``: the same ops posted in batches to a posttrain
  server (``posttrain/runs/server.py``), chosen when ``POSTTRAIN_SERVER`` is set
  (``POSTTRAIN_TOKEN`` is its bearer token). Never blocks or crashes training.

Which one a run writes to: an explicit store (``--store`` / ``POSTTRAIN_STORE``: a
PostgreSQL URL or a SQLite file's path), else the server, else the runs folder's file.

Training code talks to a ``RunHandle`` from ``open_run(name, config)``, or to ``NullRun()``
when nothing should be recorded: the two have the same methods, so callers never write
``if run:``. A handle given a run folder also appends every metric row to
``<run folder>/metrics.jsonl``, a copy that needs no database to read.

Storage trouble (a locked or full disk, an unreachable server) is reported once on
stderr and training carries on; a wrong argument (bad status, bad run name) raises.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from posttrain.runs.copy import run_ops
from posttrain.runs.http_store import HttpRunStore, check_server_url
from posttrain.runs.ops import (
    DB_FILENAME,
    FINISH_STATUSES,
    HEARTBEAT_SECONDS,
    MAX_SAMPLE_ROWS,
    RunStoreError,
    StoreUnavailable,
    check_run_name,
    clean_metrics,
)
from posttrain.runs.postgres_store import PostgresRunStore, is_postgres_url, redacted
from posttrain.runs.replaced import save_record
from posttrain.runs.sql_store import SqlRunStore
from posttrain.runs.sqlite_store import SqliteRunStore

__all__ = [
    "DB_FILENAME",
    "METRICS_FILENAME",
    "HttpRunStore",
    "NullRun",
    "PostgresRunStore",
    "RunHandle",
    "RunStore",
    "RunStoreError",
    "SqlRunStore",
    "SqliteRunStore",
    "check_run_name",
    "check_store_server",
    "default_store",
    "open_run",
    "open_store",
    "store_spec",
]

METRICS_FILENAME = "metrics.jsonl"
SERVER_ENV = "POSTTRAIN_SERVER"
TOKEN_ENV = "POSTTRAIN_TOKEN"
STORE_ENV = "POSTTRAIN_STORE"
STORE_HELP = ("the run store: a PostgreSQL URL (postgresql://user@host/db, shared by a team) "
              "or a SQLite file ($POSTTRAIN_STORE; default: <runs folder>/posttrain.db)")


@runtime_checkable
class RunStore(Protocol):
    """What a run store accepts. Timestamps are seconds since the epoch (None: now)."""

    def create_run(self, name: str, config: dict[str, Any], started: float | None = None) -> None:
        """Start run ``name`` (status ``running``), replacing an earlier run of that name."""
        ...

    def log_metrics(self, name: str, step: int, metrics: dict[str, Any],
                    timestamp: float | None = None) -> None:
        """Record finite numeric metrics at ``step``."""
        ...

    def set_progress(self, name: str, step: int, total: int | None = None,
                     eta_seconds: float | None = None, timestamp: float | None = None) -> None:
        """Record ``step`` of ``total`` and the seconds left."""
        ...

    def add_note(self, name: str, text: str, step: int | None = None,
                 timestamp: float | None = None) -> None:
        """Attach a line of text."""
        ...

    def add_alarm(self, name: str, kind: str, step: int | None, message: str,
                  details: dict[str, Any] | None = None, timestamp: float | None = None) -> None:
        """Record an alarm of ``kind`` at ``step``."""
        ...

    def finish_run(self, name: str, summary: dict[str, Any] | None = None,
                   status: str = "done", timestamp: float | None = None) -> None:
        """Mark the run done / failed / stopped and merge ``summary`` into its summary."""
        ...

    def heartbeat(self, name: str, timestamp: float | None = None) -> None:
        """Say the run's writer is alive (silence reads back as status ``lost``)."""
        ...

    def log_samples(self, name: str, step: int, rows: Any, source: str = "monitor",
                    timestamp: float | None = None) -> None:
        """Keep the graded replies of a check at ``step`` (bounded per check)."""
        ...

    def close(self) -> None:
        """Release resources, delivering anything queued."""
        ...


def store_spec(store: str | None = None) -> str | None:
    """The store asked for: ``store`` (a ``--store`` flag), else ``POSTTRAIN_STORE``; None
    when neither names one (blank counts as unset)."""
    for value in (store, os.environ.get(STORE_ENV)):
        if value is not None and value.strip():
            return value.strip()
    return None


def describe_store(spec: str) -> str:
    """``spec`` as it may be shown or recorded (a URL's password hidden)."""
    return redacted(spec) if is_postgres_url(spec) else spec


def open_store(spec: str, *, for_server: bool = False) -> SqlRunStore:
    """The store ``spec`` names: a PostgreSQL URL, else a SQLite file's path (relative
    to the working folder). ``for_server``: a dashboard's store, which answers a lost
    database with 503s instead of holding records, and tolerates a damaged file."""
    if is_postgres_url(check_store_spec(spec)):
        return PostgresRunStore(spec, hold_when_down=not for_server)
    return SqliteRunStore(spec, tolerate_damage=for_server)


def check_store_spec(spec: str) -> str:
    """``spec`` when it is a PostgreSQL URL or a file path; ``RunStoreError`` for a URL of
    another database (which would otherwise be read as a file's name)."""
    if "://" in spec and not is_postgres_url(spec):
        raise RunStoreError(f"unknown run store {describe_store(spec)!r}: expected a "
                            f"postgresql:// URL or a SQLite file's path")
    return spec


def default_store(runs_root: str | os.PathLike = "runs", store: str | None = None) -> RunStore:
    """The store a run writes to.

    The store named by ``store`` or ``POSTTRAIN_STORE`` (``open_store``); else
    ``HttpRunStore(POSTTRAIN_SERVER, POSTTRAIN_TOKEN)`` when ``POSTTRAIN_SERVER`` is set;
    else ``SqliteRunStore(<runs_root>/posttrain.db)`` (the folder is created).
    """
    spec = store_spec(store)
    if spec is not None:
        return open_store(spec)
    server = os.environ.get(SERVER_ENV, "").strip()
    if server:
        return HttpRunStore(check_server_url(server, SERVER_ENV),
                            os.environ.get(TOKEN_ENV) or None)
    return SqliteRunStore(Path(runs_root) / DB_FILENAME)


def check_store_server() -> None:
    """Refuse a malformed ``POSTTRAIN_SERVER`` now, with one line naming it: a recipe
    calls this before its model loads, since the store is opened only after. Unset or
    blank is fine (the SQLite store); whether the server answers is learnt while the run
    trains (``HttpRunStore``)."""
    server = os.environ.get(SERVER_ENV, "").strip()
    if server:
        check_server_url(server, SERVER_ENV)


def check_store_opens(runs_root: str | os.PathLike = "runs", store: str | None = None) -> None:
    """Open and close the store a run would write to, so that a damaged or unwritable
    file, or a database that does not answer, is said (``RunStoreError``, one line)
    before a model loads rather than after. With only ``POSTTRAIN_SERVER`` set there is
    nothing local to check."""
    spec = store_spec(store)
    if spec is not None:
        open_store(spec).close()
        return
    if os.environ.get(SERVER_ENV, "").strip():
        return
    SqliteRunStore(Path(runs_root) / DB_FILENAME).close()


class RunHandle:
    """One run being written. Methods never raise for storage trouble (one warning, then
    quiet); they do raise ``ValueError`` for wrong arguments.

    Also a context manager: leaving the block finishes the run ``done``, or ``failed``
    (``stopped`` on Ctrl-C) with the error in the summary, unless it was finished inside.

    Until it is finished, a background thread sends a heartbeat every ``heartbeat_seconds``
    (None: none), so a run whose process was killed reads back as ``lost``, not as
    ``running`` forever.
    """

    def __init__(self, name: str, store: RunStore, *, run_dir: str | os.PathLike | None = None,
                 owns_store: bool = False,
                 heartbeat_seconds: float | None = HEARTBEAT_SECONDS) -> None:
        self.name = check_run_name(name)
        self.store = store
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.finished = False
        self._owns_store = owns_store
        self._warned = False
        self._jsonl: IO[str] | None = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = (self.run_dir / METRICS_FILENAME).open("w", encoding="utf-8")
        self._stop_beating = threading.Event()
        self._beater: threading.Thread | None = None
        #: the run this one replaces, as the ops that write it again (``open_run``'s
        #: ``keep_replaced``): put back when this run does not finish ``done``
        self.replaced_ops: list[dict[str, Any]] | None = None
        self.replaced_owner: str | None = None
        self.restored = False
        self.start_heartbeat(heartbeat_seconds)

    def discard(self) -> None:
        """The run was refused before it started: close the store when the handle owns it
        and remove the metrics file it opened (the run folder is its claim's to remove)."""
        self.finished = True
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
            assert self.run_dir is not None
            (self.run_dir / METRICS_FILENAME).unlink(missing_ok=True)
        if self._owns_store:
            try:
                self.store.close()
            except Exception:  # closing after a refusal: what it says adds nothing
                pass

    def start_heartbeat(self, interval: float | None) -> None:
        """Send a heartbeat every ``interval`` seconds until the run is finished (None or 0:
        no heartbeat; a second call while one beats changes nothing)."""
        if interval is None or interval <= 0 or self._beater is not None or self.finished:
            return
        self._beater = threading.Thread(target=self._beat, args=(interval,), daemon=True,
                                        name=f"posttrain-heartbeat-{self.name}")
        self._beater.start()

    def _beat(self, interval: float) -> None:
        while not self._stop_beating.wait(interval):
            self._guard("send a heartbeat", self.store.heartbeat, None)

    @property
    def url(self) -> str | None:
        """The run's dashboard page when the store is a server (``<server>/runs/<name>``)."""
        if isinstance(self.store, HttpRunStore):
            return f"{self.store.server_url}/runs/{self.name}"
        return None

    def _guard(self, action: str, call: Any, *args: Any) -> None:
        try:
            call(self.name, *args)
        except StoreUnavailable as error:  # the store broke under the run: the folder has it all
            self._warn(action, error)
        except (RunStoreError, TypeError):
            raise
        except Exception as error:  # storage trouble must never stop training
            self._warn(action, error)

    def _warn(self, action: str, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            print(f"posttrain: run store could not {action} for run {self.name!r} "
                  f"({type(error).__name__}: {error}); training continues and its folder "
                  f"keeps every file, later store errors for this run are not shown",
                  file=sys.stderr, flush=True)

    def log(self, step: int, metrics: dict[str, Any], *, timestamp: float | None = None) -> None:
        """Record metric values at ``step``. Non-numeric, boolean and non-finite values are
        dropped; a metric logged twice at one step keeps the later value."""
        _check_step(step)
        values = clean_metrics(metrics)
        if not values:
            return
        moment = time.time() if timestamp is None else timestamp
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, "time": moment, "metrics": values}) + "\n")
            self._jsonl.flush()  # a killed run keeps every complete line
        self._guard("log metrics", self.store.log_metrics, step, values, moment)

    def progress(self, step: int, total: int | None = None,
                 eta_seconds: float | None = None) -> None:
        """Record progress: ``step`` of ``total`` with ``eta_seconds`` left (None: unknown)."""
        _check_step(step)
        if eta_seconds is not None and not math.isfinite(eta_seconds):
            eta_seconds = None
        self._guard("set progress", self.store.set_progress, step, total, eta_seconds, None)

    def note(self, text: str, *, step: int | None = None) -> None:
        """Attach a line of text to the run (shown on its page)."""
        self._guard("add a note", self.store.add_note, str(text), step, None)

    def alarm(self, kind: str, step: int | None, message: str,
              details: dict[str, Any] | None = None) -> None:
        """Record an alarm (``hack``, ``length``, ``guard``, ...) with its evidence."""
        self._guard("add an alarm", self.store.add_alarm, kind, step, message, details or {},
                    None)

    def samples(self, step: int, rows: list[dict[str, Any]], source: str = "monitor") -> None:
        """Keep graded replies of a check at ``step`` for the dashboard (``monitor``: the
        holdout replies the hack monitor sampled; ``rollouts``: training replies). At most
        ``MAX_SAMPLE_ROWS`` are kept; long texts are cut."""
        _check_step(step)
        self._guard("keep samples", self.store.log_samples, step, sample_view(rows), source,
                    None)

    def finish(self, summary: dict[str, Any] | None = None, status: str = "done") -> None:
        """Mark the run ``done``, ``failed`` or ``stopped`` with its summary, then close the
        metrics copy (and the store when this handle opened it). A second call is ignored
        with a warning."""
        if status not in FINISH_STATUSES:
            raise ValueError(f"status must be one of {list(FINISH_STATUSES)}, got {status!r}")
        if self.finished:
            print(f"posttrain: run {self.name!r} was already finished; ignoring finish("
                  f"status={status!r})", file=sys.stderr, flush=True)
            return
        self.finished = True
        self._stop_beating.set()
        if self._beater is not None:
            self._beater.join(timeout=10)
        self._guard("finish", self.store.finish_run, summary or {}, status, None)
        if status != "done" and self.replaced_ops and isinstance(self.store, SqlRunStore):
            # --overwrite: the new run did not get through, so the old one comes back
            try:
                self.store.apply(self.replaced_ops, owner=self.replaced_owner)
                self.restored = True
            except Exception as error:  # never more than a warning, as every store call
                self._warn("restore the run it replaced", error)
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._owns_store:
            try:
                self.store.close()
            except Exception as error:
                print(f"posttrain: closing the run store failed ({error})", file=sys.stderr)

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if self.finished:
            return
        if exc_type is None:
            self.finish(status="done")
        else:
            status = "stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed"
            self.finish({"error": f"{exc_type.__name__}: {exc}"}, status=status)


class NullRun:
    """A run that records nothing: the same methods as ``RunHandle``, all no-ops."""

    name = ""
    run_dir = None
    url = None
    finished = False

    def log(self, step: int, metrics: dict[str, Any], *, timestamp: float | None = None) -> None:
        """Do nothing."""

    def progress(self, step: int, total: int | None = None,
                 eta_seconds: float | None = None) -> None:
        """Do nothing."""

    def note(self, text: str, *, step: int | None = None) -> None:
        """Do nothing."""

    def alarm(self, kind: str, step: int | None, message: str,
              details: dict[str, Any] | None = None) -> None:
        """Do nothing."""

    def samples(self, step: int, rows: list[dict[str, Any]], source: str = "monitor") -> None:
        """Do nothing."""

    def finish(self, summary: dict[str, Any] | None = None, status: str = "done") -> None:
        """Do nothing."""
        self.finished = True

    def __enter__(self) -> NullRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


#: the fields of a graded row the dashboard shows, and how long a text may be there
SAMPLE_FIELDS = ("prompt", "scenario_id", "category", "sample", "reply", "score", "reward",
                 "markers", "transcript", "episode")
SAMPLE_TEXT_CHARS = 4000


def sample_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``MAX_SAMPLE_ROWS`` rows with the fields the dashboard shows, texts cut
    at ``SAMPLE_TEXT_CHARS`` (a view for people; the run folder keeps what was graded)."""
    view = []
    for row in rows[:MAX_SAMPLE_ROWS]:
        kept = {key: row[key] for key in SAMPLE_FIELDS if key in row}
        for key in ("prompt", "reply"):
            if isinstance(kept.get(key), str) and len(kept[key]) > SAMPLE_TEXT_CHARS:
                kept[key] = kept[key][:SAMPLE_TEXT_CHARS] + " …"
        view.append(kept)
    return view


def _check_step(step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")


def open_run(name: str, config: dict[str, Any], *, store: RunStore | None = None,
             run_dir: str | os.PathLike | None = None,
             runs_root: str | os.PathLike = "runs", store_url: str | None = None,
             heartbeat_seconds: float | None = HEARTBEAT_SECONDS,
             keep_replaced: bool = False, replaced_folder: Path | None = None) -> RunHandle:
    """Start run ``name`` with its ``config`` and return the handle that writes it.

    ``keep_replaced`` (``--overwrite``): an earlier run of the same name in a SQL store is
    read first and written back when this run finishes anything but ``done`` (a store the
    handle cannot read back, a run server, keeps only the new record); with
    ``replaced_folder`` (the old run's folder, moved aside) it is also saved there before
    the new record replaces it, so a process killed meanwhile loses nothing
    (``posttrain runs restore``). A record that cannot be saved there refuses the run.

    ``store``: where to write; None picks ``default_store(runs_root, store_url)`` (the
    store named by ``store_url`` or ``POSTTRAIN_STORE``, else the server named by
    ``POSTTRAIN_SERVER``, else ``<runs_root>/posttrain.db``) and the handle closes it on
    ``finish``. ``run_dir``: the run folder, which gets ``metrics.jsonl``.
    ``heartbeat_seconds``: how often the handle says the run is alive (None: never). An
    earlier run of the same name in the store is replaced. Raises ``RunStoreError`` for a
    name that could escape the runs folder (``../x``, ``a/b``, ``.hidden``).
    """
    check_run_name(name)
    owns_store = store is None
    if store is None:
        store = default_store(runs_root, store_url)
    # created before the heartbeat thread starts: a beat never precedes the create
    handle = RunHandle(name, store, run_dir=run_dir, owns_store=owns_store,
                       heartbeat_seconds=None)
    if keep_replaced and isinstance(store, SqlRunStore):
        try:
            earlier = store.get_run(name)
            if earlier is not None:
                handle.replaced_ops = list(run_ops(store, earlier))
                handle.replaced_owner = earlier.get("owner")
        except Exception as error:  # then only the new record is kept, as before
            handle._warn("read the run it replaces", error)
            earlier = None
        if earlier is not None and replaced_folder is not None:
            try:
                save_record(replaced_folder, handle.replaced_ops or [], earlier.get("owner"))
            except (OSError, ValueError) as error:
                handle.discard()
                raise RunStoreError(f"--overwrite: could not keep the record of the run it "
                                    f"replaces in {replaced_folder} ({error}); nothing was "
                                    "replaced") from None
    try:
        handle._guard("create the run", store.create_run, dict(config), None)
    except BaseException:  # refused (a run server that says no): the handle leaves nothing
        handle.discard()
        raise
    handle.start_heartbeat(heartbeat_seconds)
    return handle
