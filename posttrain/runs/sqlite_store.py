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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.runs import sql
from posttrain.runs.ops import LOST_AFTER_SECONDS, DamagedStore, RunStoreError
from posttrain.runs.sql_store import SqlRunStore

SCHEMA_VERSION = sql.SCHEMA_VERSION
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
        for statement in sql.schema_statements(sql.SQLITE):
            scratch.execute(statement)
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


class SqliteRunStore(SqlRunStore):
    """Run store on one SQLite file; safe for one writer and many readers across processes.

    What it does (apply ops, delete, read) is ``SqlRunStore``'s; this class opens the
    file, migrates and backs it up, and names a damaged file. Each write commits before
    returning; reads open a short-lived connection per call, so the object can be shared
    by a threaded HTTP server.
    """

    def __init__(self, path: str | Path, *, lost_after_seconds: float = LOST_AFTER_SECONDS,
                 tolerate_damage: bool = False) -> None:
        self.path = Path(path)
        self.location = str(self.path)
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
        """Create, check or migrate the schema. Several processes may open a new store at
        once (eight runs started together): creating the tables and stamping their version
        is one ``BEGIN IMMEDIATE`` transaction, so the others wait for it and then find the
        store current, never a half-made one they would take for an old store."""
        mode = self._wal_mode()
        if str(mode).lower() != "wal":
            raise RunStoreError(f"{self.path}: SQLite could not switch to WAL mode (got {mode})")
        version, has_tables = self._version_and_tables()
        if version < SCHEMA_VERSION and has_tables:
            self._back_up(version)  # outside the write lock: a copy of an old store
        with self._lock:
            cursor = self._writer.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                version = self._check_version()  # another opener may have done it meanwhile
                for statement in sql.schema_statements(sql.SQLITE):
                    cursor.execute(statement)
                if version < SCHEMA_VERSION:
                    # a store written before tiles existed gets them once, here
                    sql.migrate(sql.Db(cursor, sql.SQLITE), version)
                    cursor.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        missing = missing_columns(self._writer)
        if missing:
            raise DamagedStore(damaged_message(
                self.path, f"its tables lack {', '.join(missing[:5])}"))

    def _wal_mode(self) -> str:
        """Switch to WAL. The first switch of a new file needs it to itself, and SQLite
        answers 'locked' at once (not after the busy timeout) while another opener
        switches it: try again for up to the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                return str(self._writer.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _check_version(self) -> int:
        return self._known(int(self._writer.execute("PRAGMA user_version").fetchone()[0]))

    def _known(self, version: int) -> int:
        """``version``, refused when it is newer than this posttrain understands."""
        if version > SCHEMA_VERSION:
            raise RunStoreError(
                f"{self.path}: run store schema {version} is newer than this posttrain "
                f"understands ({SCHEMA_VERSION}); upgrade posttrain or use another file"
            )
        return version

    def _version_and_tables(self) -> tuple[int, bool]:
        """The schema version and whether the file has tables, read in one statement (one
        snapshot): read apart, a new store another opener commits in between reads as
        version 0 *with* tables, an old store to back up."""
        version, tables = self._writer.execute(
            "SELECT (SELECT user_version FROM pragma_user_version), "
            "(SELECT count(*) FROM sqlite_master)").fetchone()
        return self._known(int(version)), tables > 0

    def backup_path(self, version: int) -> Path:
        """Where the copy of a schema-``version`` store is kept before it is migrated."""
        return self.path.with_name(f"{self.path.name}.v{version}.bak")

    def _back_up(self, version: int) -> None:
        """Copy the store aside before a migration rewrites it (SQLite's online backup: a
        consistent copy even while another process writes). An existing copy is kept."""
        target = self.backup_path(version)
        if target.exists():
            return
        # a name of its own: two processes migrating at once never write one file
        partial = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.partial")
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

    def _read_connection(self) -> sqlite3.Connection:
        return self._connect()

    @contextmanager
    def _write(self) -> Iterator[sql.Db]:
        """One write transaction on the writer connection (``BEGIN IMMEDIATE``: the write
        lock is taken up front, so two writers queue instead of failing mid-way)."""
        with self._lock:
            cursor = self._writer.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield sql.Db(cursor, sql.SQLITE)
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the writer connection (reads still open their own)."""
        with self._lock:
            self._writer.close()
