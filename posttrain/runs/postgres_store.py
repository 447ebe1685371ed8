"""The run store on a PostgreSQL server, named by URL (``postgresql://user@host/db``).

A team points every run (several people, a torchrun job on several machines, Modal
workers) and one dashboard at one database. The schema, writes and reads are the SQLite
store's (``posttrain.runs.sql``); this class connects, keeps the schema's version in
``posttrain_schema`` (created and migrated under an advisory lock, so eight runs starting
at once do not race), and survives a lost connection:

- Every batch of ops carries an id claimed in the same transaction (``ingested_batches``),
  so a batch re-sent after a connection died mid-commit is applied once.
- A training process's store (``hold_when_down``, the default) keeps the ops it could not
  deliver, in order, and delivers them once the server answers again: a restart of the
  database loses no point. It says so once on stderr; ``close`` waits up to
  ``close_wait_seconds`` for the rest and then names what was not delivered (the run
  folder's ``metrics.jsonl`` has every point either way).
- A server's store (``hold_when_down=False``: the dashboard's ingest) raises
  ``StoreUnreachable`` instead, a 503 its HTTP clients retry.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from posttrain.access import ADMIN, Caller
from posttrain.runs import sql
from posttrain.runs.ops import LOST_AFTER_SECONDS, RunStoreError, StoreUnreachable
from posttrain.runs.sql_store import SqlRunStore
from posttrain.text import error_line

URL_SCHEMES = ("postgresql", "postgres")
# any number, the same in every posttrain: serialises schema creation across processes
_SCHEMA_LOCK_KEY = 0x706F7374  # "post"
RECONNECT_EVERY_SECONDS = 2.0


def is_postgres_url(spec: str) -> bool:
    """Does ``spec`` name a PostgreSQL database (``postgresql://`` or ``postgres://``)?"""
    return spec.split("://", 1)[0].lower() in URL_SCHEMES and "://" in spec


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages, logs and configs)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<a malformed URL>"
    if password is None:
        return url
    # the netloc as written after the "@" (a port that is not a number stays as it was:
    # ``parts.port`` would raise on it)
    host_and_port = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host_and_port}"))


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with the URL's password, as written and
    as decoded, replaced by ``***``: libpq echoes parts of a connection string back."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password or "", unquote(password or "")} - {""}:
        text = text.replace(secret, "***")
    return text


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise RunStoreError(
            "a PostgreSQL run store needs psycopg: pip install 'posttrain[postgres]'"
        ) from None
    return psycopg


class PostgresRunStore(SqlRunStore):
    """Run store on a PostgreSQL database; safe for many writers and readers at once.

    ``url``: a libpq URL (``postgresql://user:password@host:5432/db``; ``?sslmode=...``
    and the other libpq parameters pass through). Opening it connects, creates the tables
    when missing and refuses a schema newer than this posttrain's (``RunStoreError``);
    a server that does not answer within ``connect_timeout`` is ``StoreUnreachable``.
    """

    dialect = sql.POSTGRES

    def __init__(self, url: str, *, lost_after_seconds: float = LOST_AFTER_SECONDS,
                 hold_when_down: bool = True, connect_timeout: float = 5.0,
                 close_wait_seconds: float = 30.0) -> None:
        if not is_postgres_url(url):
            raise RunStoreError(f"not a PostgreSQL URL: {redacted(url)!r} (expected "
                                f"postgresql://user@host/database)")
        self._psycopg = _driver()
        self.url = url
        self.location = redacted(url)
        self.lost_after_seconds = lost_after_seconds
        self.hold_when_down = hold_when_down
        self.connect_timeout = connect_timeout
        self.close_wait_seconds = close_wait_seconds
        self._lock = threading.RLock()
        self._writer: Any = None
        self._held: list[tuple[list[dict[str, Any]], str, str | None]] = []
        self._down_since: float | None = None
        self._next_attempt = 0.0
        self._closed = False
        self._ensure_schema()

    # --- connections -------------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> Any:
        try:
            return self._psycopg.connect(self.url, autocommit=autocommit,
                                         connect_timeout=max(1, round(self.connect_timeout)))
        except self._psycopg.OperationalError as error:
            raise StoreUnreachable(self._unreachable(error)) from None
        except self._psycopg.ProgrammingError as error:  # a URL libpq cannot parse
            raise RunStoreError(f"bad PostgreSQL URL {self.location}: "
                                f"{scrubbed(error_line(error), self.url)}") from None

    def _unreachable(self, error: BaseException) -> str:
        return (f"the run store {self.location} cannot be reached "
                f"({scrubbed(error_line(error), self.url)}); check that the server runs and "
                "the URL's host, port, user and database")

    def _connection_lost(self, error: BaseException) -> bool:
        errors = (self._psycopg.OperationalError, self._psycopg.InterfaceError)
        return isinstance(error, errors)

    @contextmanager
    def _intact(self) -> Iterator[None]:
        """A lost or refused connection becomes ``StoreUnreachable`` (one line, the URL
        without its password) instead of a driver traceback."""
        try:
            yield
        except StoreUnreachable:
            raise
        except Exception as error:
            if self._connection_lost(error):
                raise StoreUnreachable(self._unreachable(error)) from None
            if isinstance(error, self._psycopg.errors.InsufficientPrivilege):
                raise RunStoreError(
                    f"the run store {self.location} refused this user "
                    f"({scrubbed(error_line(error), self.url)}): it needs to create and "
                    "write the posttrain tables (or have an owner create them first)"
                ) from None
            if isinstance(error, self._psycopg.Error):  # the database's refusal, one line
                raise RunStoreError(f"the run store {self.location} refused a request "
                                    f"({scrubbed(error_line(error), self.url)})") from None
            raise

    def _read_connection(self) -> Any:
        return self._connect(autocommit=True)

    @contextmanager
    def _write(self) -> Iterator[sql.Db]:
        """One transaction on the writer connection (opened again after it was lost)."""
        with self._lock:
            if self._writer is None or self._writer.closed:
                self._writer = self._connect(autocommit=False)
            connection = self._writer
            try:
                with connection.transaction():
                    yield sql.Db(connection.cursor(), sql.POSTGRES)
            except BaseException as error:
                if self._connection_lost(error):
                    self._drop_writer()
                raise

    def _drop_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                pass  # already broken: nothing to release
        self._writer = None

    def _ensure_schema(self) -> None:
        """Create or migrate the tables, one process at a time (an advisory lock)."""
        with self._intact(), self._write() as db:
            db.run("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK_KEY,))
            db.run("CREATE TABLE IF NOT EXISTS posttrain_schema (version INTEGER NOT NULL)")
            row = db.one("SELECT max(version) FROM posttrain_schema")
            version = row[0] if row is not None else None
            if version is not None and version > sql.SCHEMA_VERSION:
                raise RunStoreError(
                    f"{self.location}: run store schema {version} is newer than this "
                    f"posttrain understands ({sql.SCHEMA_VERSION}); upgrade posttrain or use "
                    f"another database")
            for statement in sql.schema_statements(sql.POSTGRES):
                db.run(statement)
            if version is None:
                db.run("INSERT INTO posttrain_schema (version) VALUES (?)",
                       (sql.SCHEMA_VERSION,))
            elif version < sql.SCHEMA_VERSION:
                sql.migrate(db, version)
                db.run("UPDATE posttrain_schema SET version = ?", (sql.SCHEMA_VERSION,))

    def schema_version(self) -> int:
        """The schema version the database records."""
        with self._reader() as db:
            return int(db.one("SELECT max(version) FROM posttrain_schema")[0])

    # --- writing -----------------------------------------------------------------------

    def _apply_checked(self, checked: list[dict[str, Any]], batch_id: str | None,
                       owner: str | None = None, caller: Caller = ADMIN) -> int:
        # an id for every batch: a retry after a connection died mid-commit is applied once
        batch = batch_id if batch_id is not None else uuid.uuid4().hex
        if not self.hold_when_down or caller.restricted:
            # a server's ingest (a named caller) is answered now, never held
            return self._deliver(checked, batch, owner, caller)
        now = time.time()
        for op in checked:  # held ops keep the time they were logged, not delivered
            if op["time"] is None and op["op"] != "heartbeat":
                op["time"] = now
        with self._lock:
            self._held.append((checked, batch, owner))
            self._deliver_held(wait_seconds=0.0)
        return len(checked)

    def _deliver(self, checked: list[dict[str, Any]], batch: str, owner: str | None,
                 caller: Caller = ADMIN) -> int:
        """Apply one batch; a connection found dead (a restarted server) is opened again
        and the batch tried once more."""
        try:
            return super()._apply_checked(checked, batch, owner, caller)
        except StoreUnreachable:
            return super()._apply_checked(checked, batch, owner, caller)

    def _deliver_held(self, wait_seconds: float) -> None:
        """Deliver held batches in order; while the server is down, try again at most
        every ``RECONNECT_EVERY_SECONDS`` (or until ``wait_seconds`` have passed)."""
        deadline = time.monotonic() + wait_seconds
        while self._held:
            if self._down_since is not None and time.monotonic() < self._next_attempt:
                if time.monotonic() >= deadline:
                    return
                time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
                continue
            ops, batch, owner = self._held[0]
            try:
                self._deliver(ops, batch, owner)
            except StoreUnreachable as error:
                self._next_attempt = time.monotonic() + RECONNECT_EVERY_SECONDS
                if self._down_since is None:
                    self._down_since = time.time()
                    print(f"posttrain: {error}; holding this run's records and retrying "
                          f"every {RECONNECT_EVERY_SECONDS:.0f} s (training continues)",
                          file=sys.stderr, flush=True)
                if time.monotonic() >= deadline:
                    return
                continue
            self._held.pop(0)
            if self._down_since is not None and not self._held:
                print(f"posttrain: the run store {self.location} answers again after "
                      f"{time.time() - self._down_since:.0f} s; every held record is "
                      f"delivered", file=sys.stderr, flush=True)
                self._down_since = None

    def held_ops(self) -> int:
        """How many ops wait for the server to answer again."""
        with self._lock:
            return sum(len(ops) for ops, _, _ in self._held)

    def close(self) -> None:
        """Deliver what is held (waiting up to ``close_wait_seconds``), then disconnect.
        Raises ``StoreUnreachable`` naming what could not be delivered."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._held:
                self._next_attempt = 0.0
                self._deliver_held(wait_seconds=self.close_wait_seconds)
            left = sum(len(ops) for ops, _, _ in self._held)
            runs = sorted({op["run"] for ops, _, _ in self._held for op in ops})
            self._held.clear()
            self._drop_writer()
        if left:
            raise StoreUnreachable(
                f"{left} records of run(s) {', '.join(runs)} were not delivered to "
                f"{self.location} (no answer for {self.close_wait_seconds:.0f} s); each "
                f"run folder's metrics.jsonl has every point")
