"""The tinker routes' journal: every submission that changes the service, kept before it
is answered, so a restarted ``posttrain serve`` can rebuild what a killed one held.

What the tinker SDK holds on to across calls lives in this process's memory: sessions,
training clients (engine runs with their adapter, AdamW moments and pending gradients),
sampling sessions and futures. Rather than snapshotting tensors after every primitive, the
service keeps each *submission* (its route, body and caller) with every value the server
chose for it at random (``Choices``: session, run and sampling-session ids, request ids,
LoRA and sampling seeds, and decisions that depend on the disk as it was, such as "this
checkpoint name is taken"). Replaying the submissions in order on a fresh engine
(``replay``) rebuilds the same state: the engine computes on one thread, so the same
requests on the same machine give the same tensors.

Where it is kept: ``tinker-journal.sqlite`` in the state folder, or a PostgreSQL database
named by URL (``posttrain serve --state-store postgresql://...``), one journal per state
folder (``service.json`` there holds the id that keys its rows). Sample answers that a
client has collected are kept too, so a replay need not sample them again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from posttrain.access import NAME as CALLER_NAME
from posttrain.atomic import write_text_atomic
from posttrain.runs import sql
from posttrain.runs.postgres_store import is_postgres_url, redacted
from posttrain.service.engine.errors import ServiceError
from posttrain.text import echo, error_line

T = TypeVar("T")
JOURNAL_FILE = "tinker-journal.sqlite"
SERVICE_FILE = "service.json"
# the journal's record of a session whose heartbeat lapsed (a finish is its request)
SESSION_EXPIRED = "session_expired"
ENDS_A_SESSION = frozenset({"finish_session", SESSION_EXPIRED})

_TABLES = """
CREATE TABLE IF NOT EXISTS tinker_journal (
    position {serial}, service TEXT NOT NULL, route TEXT NOT NULL, path_match TEXT NOT NULL,
    body {blob} NOT NULL, content_encoding TEXT, caller TEXT, choices TEXT NOT NULL,
    session_id TEXT, at {real} NOT NULL
);
CREATE INDEX IF NOT EXISTS tinker_journal_by_service ON tinker_journal (service, position);
CREATE TABLE IF NOT EXISTS tinker_answers (
    service TEXT NOT NULL, request_id TEXT NOT NULL, content_type TEXT NOT NULL,
    body {blob} NOT NULL, at {real} NOT NULL, PRIMARY KEY (service, request_id)
);
"""


class ReplayMismatch(RuntimeError):
    """A replayed submission asked for a choice its journal entry does not hold."""


@dataclass
class Choices:
    """The values one submission chose at random or from the state of the disk, in the
    order it chose them. Live, ``pick(make)`` calls ``make`` and keeps the value; in a
    replay it hands back the kept values in the same order instead."""

    values: list[Any] = field(default_factory=list)
    replaying: bool = False
    session_id: str | None = None  # the tinker session the submission belongs to
    _next: int = 0

    def pick(self, make: Callable[[], T]) -> T:
        """A value for this submission: ``make()`` live, the kept one in a replay."""
        if not self.replaying:
            value = make()
            self.values.append(value)
            return value
        if self._next >= len(self.values):
            raise ReplayMismatch(f"the journal entry holds {len(self.values)} choices; the "
                                 "replayed submission asked for one more")
        value = self.values[self._next]
        self._next += 1
        return value  # type: ignore[no-any-return]

    @staticmethod
    def replay(values: list[Any], session_id: str | None) -> Choices:
        return Choices(list(values), replaying=True, session_id=session_id)


@dataclass(frozen=True)
class Entry:
    """One journaled submission."""

    route: str  # the handler's name: create_model, forward_backward, asample, ...
    path_match: dict[str, str]  # the path's parameters (a session id, a checkpoint's)
    body: bytes
    content_encoding: str | None
    caller: str | None  # the tokens-file name that sent it; None for the administrator
    choices: list[Any]
    session_id: str | None
    position: int = 0


def service_id(state_dir: Path) -> str:
    """The id that keys this state folder's journal rows (made once, kept in
    ``service.json``): two servers sharing one PostgreSQL database keep apart."""
    path = state_dir / SERVICE_FILE
    try:
        found = json.loads(path.read_text()).get("service_id")
        if isinstance(found, str) and found:
            return found
    except (OSError, ValueError, AttributeError):
        pass
    made = "svc-" + uuid.uuid4().hex[:16]
    write_text_atomic(path, json.dumps({"service_id": made}) + "\n")
    return made


class Journal:
    """The journal of one state folder, in SQLite (default) or PostgreSQL (``store``:
    a ``postgresql://`` URL). Thread-safe; every write is committed before it returns."""

    def __init__(self, state_dir: Path, store: str | None = None):
        self.service = service_id(state_dir)
        self._lock = threading.Lock()
        if store and is_postgres_url(store):
            self.dialect = sql.POSTGRES
            self.location = redacted(store)
            try:
                import psycopg
            except ImportError:
                raise ServiceError("a PostgreSQL state store needs psycopg: pip install "
                                   "'posttrain[postgres]'", status=500) from None
            self._errors: tuple[type[BaseException], ...] = (psycopg.Error,)
            self._reconnect: Callable[[], Any] = lambda: psycopg.connect(store,
                                                                         connect_timeout=5)
        elif store:
            raise ServiceError(f"--state-store: expected a postgresql:// URL, got "
                               f"{redacted(store)!r} (leave it out for the SQLite file in "
                               "the state folder)", status=400)
        else:
            self.dialect = sql.SQLITE
            path = state_dir / JOURNAL_FILE
            self.location = str(path)
            self._errors = (sqlite3.Error,)
            self._reconnect = lambda: sqlite3.connect(path, timeout=30, isolation_level=None,
                                                      check_same_thread=False)
        self._connection: Any = None
        self.damaged: list[str] = []  # rows the last ``entries`` left out, and why
        blob = "BYTEA" if self.dialect is sql.POSTGRES else "BLOB"
        text = _TABLES.format(serial=self.dialect.serial_key, blob=blob,
                              real=self.dialect.real)
        with self._transaction() as db:
            for statement in (part.strip() for part in text.split(";")):
                if statement:
                    db.run(statement)

    def _connected(self) -> Any:
        """The connection, made again after one was lost (a database restart)."""
        if self._connection is None:
            try:
                connection = self._reconnect()
                if self.dialect is sql.SQLITE:
                    connection.execute("PRAGMA journal_mode=WAL")
            except self._errors as error:
                if self.dialect is sql.SQLITE:  # a file that is not a database stays so
                    raise ServiceError(
                        f"the tinker journal {self.location} cannot be opened "
                        f"({error_line(error)}): move it aside to start with an empty one "
                        "(the sessions, training clients and futures it held are then "
                        "forgotten; saved checkpoints stay)", status=500) from None
                raise ServiceError(f"the state store {self.location} cannot be reached "
                                   f"({error_line(error)}); retry", status=503) from None
            self._connection = connection
        return self._connection

    @contextmanager
    def _transaction(self) -> Iterator[sql.Db]:
        """One committed transaction; a database error is a 503 (the SDK retries it, and
        a retried submission finds its first future) and the connection is made anew."""
        with self._lock:
            cursor = self._connected().cursor()
            try:
                if self.dialect is sql.SQLITE:
                    cursor.execute("BEGIN IMMEDIATE")
                yield sql.Db(cursor, self.dialect)
                if self.dialect is sql.POSTGRES:
                    self._connection.commit()
                else:
                    cursor.execute("COMMIT")
            except BaseException as error:
                self._drop_connection()
                if isinstance(error, self._errors):
                    raise ServiceError(f"the state store {self.location} failed a write "
                                       f"({error_line(error)}); retry", status=503) from None
                raise

    def _drop_connection(self) -> None:
        """Forget the connection after a failed transaction (rolled back by closing it)."""
        connection, self._connection = self._connection, None
        try:
            connection.close()
        except self._errors:
            pass

    def append(self, entry: Entry) -> None:
        """Keep ``entry`` (committed when this returns)."""
        with self._transaction() as db:
            db.run("INSERT INTO tinker_journal (service, route, path_match, body, "
                   "content_encoding, caller, choices, session_id, at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (self.service, entry.route, json.dumps(entry.path_match), entry.body,
                    entry.content_encoding, entry.caller, json.dumps(entry.choices),
                    entry.session_id, time.time()))

    def entries(self) -> list[Entry]:
        """Every kept submission, oldest first; a row whose values do not have an entry's
        shape is left out and described in ``self.damaged``."""
        with self._transaction() as db:
            rows = db.all("SELECT position, route, path_match, body, content_encoding, "
                          "caller, choices, session_id FROM tinker_journal WHERE service = ? "
                          "ORDER BY position", (self.service,))
        self.damaged = []
        entries: list[Entry] = []
        for row in rows:
            entry, problem = _entry_of(row)
            if entry is None:  # data, checked on read: said and left out, never a traceback
                self.damaged.append(f"entry {row[0]}: damaged, not replayed ({problem})")
            else:
                entries.append(entry)
        return entries

    def forget_sessions(self, session_ids: set[str]) -> int:
        """Drop the entries and answers of ``session_ids`` (finished sessions: nothing of
        theirs is replayed); returns how many entries went."""
        if not session_ids:
            return 0
        with self._transaction() as db:
            gone = 0
            for session_id in sorted(session_ids):
                gone += db.run("DELETE FROM tinker_journal WHERE service = ? AND "
                               "session_id = ?", (self.service, session_id)).rowcount
            return gone

    def keep_answer(self, request_id: str, content_type: str, body: bytes) -> None:
        """Keep a collected answer (samples), so a replay can hand it back unrecomputed."""
        with self._transaction() as db:
            db.run("DELETE FROM tinker_answers WHERE service = ? AND request_id = ?",
                   (self.service, request_id))
            db.run("INSERT INTO tinker_answers (service, request_id, content_type, body, at) "
                   "VALUES (?, ?, ?, ?, ?)",
                   (self.service, request_id, content_type, body, time.time()))

    def answers(self) -> dict[str, tuple[str, bytes]]:
        """The kept answers: request id -> (content type, body)."""
        with self._transaction() as db:
            rows = db.all("SELECT request_id, content_type, body FROM tinker_answers "
                          "WHERE service = ?", (self.service,))
        return {request_id: (content_type, bytes(body))
                for request_id, content_type, body in rows}

    def forget_answers(self, request_ids: set[str]) -> None:
        """Drop answers no replayed future names any more."""
        with self._transaction() as db:
            for request_id in sorted(request_ids):
                db.run("DELETE FROM tinker_answers WHERE service = ? AND request_id = ?",
                       (self.service, request_id))

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._drop_connection()


def _entry_of(row: tuple[Any, ...]) -> tuple[Entry | None, str]:
    """A journal row as an ``Entry``, or None and what is wrong with it (stored values are
    data: each is checked for its shape before anything uses it)."""
    position, route, match, body, encoding, caller, choices, session_id = row
    try:
        match, choices = json.loads(match), json.loads(choices)
    except (TypeError, ValueError):
        return None, "path_match or choices is not JSON"
    if not isinstance(route, str) or not route.isidentifier():
        return None, f"route {echo(route)}"
    if not isinstance(match, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in match.items()):
        return None, "path_match is not an object of strings"
    if not isinstance(choices, list):
        return None, "choices is not a list"
    for name, value in (("content_encoding", encoding), ("session_id", session_id)):
        if value is not None and not isinstance(value, str):
            return None, f"{name} {echo(value)}"
    if caller is not None and not (isinstance(caller, str) and CALLER_NAME.fullmatch(caller)):
        return None, f"caller {echo(caller)}"
    if not isinstance(body, (bytes, bytearray, memoryview)):
        return None, "body is not bytes"
    return Entry(route, match, bytes(body), encoding, caller, choices, session_id,
                 position), ""
