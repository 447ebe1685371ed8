"""The engine's sessions: opened by a client, kept alive by its heartbeats, closed or expired.

A session lives while it heartbeats; one silent for longer than its
``heartbeat_timeout_s`` expires (``expire_silent``), and closing or expiring a session
cancels its runs that are still active (``cancel_runs``, which the engine passes in).
The table shares the engine's lock, so a run added to a session and the session's
closing cannot interleave.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.service.engine.errors import Conflict, NotFound


@dataclass
class Session:
    """One client's session and the runs created in it."""

    session_id: str
    heartbeat_timeout_s: float
    last_heartbeat: float
    created_at: float = field(default_factory=time.time)
    status: str = "open"  # open | closed | expired
    run_ids: list[str] = field(default_factory=list)
    owner: str | None = None  # the tokens-file name that opened it (None: the administrator)

    def to_json(self) -> dict[str, Any]:
        """The session as the API serves it."""
        return {
            "session_id": self.session_id,
            "status": self.status,
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "run_ids": list(self.run_ids),
            "created_at": self.created_at,
            "owner": self.owner,
        }


def new_session_id() -> str:
    return "sess-" + uuid.uuid4().hex[:16]


class Sessions:
    """Every session the engine has seen, by id; thread-safe under the engine's ``lock``."""

    def __init__(self, lock: threading.RLock, clock: Callable[[], float],
                 cancel_runs: Callable[[Session, str], None]):
        self._lock = lock
        self._clock = clock
        self._cancel_runs = cancel_runs
        self._sessions: dict[str, Session] = {}

    def create(self, heartbeat_timeout_s: float, session_id: str | None = None,
               owner: str | None = None) -> dict[str, Any]:
        """A new open session (its json); ``session_id`` names it (a replay rebuilding a
        session a restart lost), else a fresh id is drawn; ``owner`` opened it."""
        session = Session(session_id or new_session_id(), heartbeat_timeout_s, self._clock(),
                          owner=owner)
        with self._lock:
            if session.session_id in self._sessions:
                raise Conflict(f"session {session.session_id} exists already")
            self._sessions[session.session_id] = session
        return session.to_json()

    def open(self, session_id: Any) -> Session:
        """The open session ``session_id``: ``NotFound`` when there is none (or the id is not
        a string), ``Conflict`` when it is closed or expired."""
        with self._lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
            if session is None:
                raise NotFound(f"no session {session_id!r}; create one first")
            if session.status != "open":
                raise Conflict(f"session {session_id} is {session.status}; create a new one")
            return session

    def find(self, session_id: str) -> Session | None:
        """Session ``session_id`` in any state, or None (under the engine's lock)."""
        return self._sessions.get(session_id)

    def _known(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        return session

    def get(self, session_id: str) -> dict[str, Any]:
        """Session ``session_id`` in any state (its json); ``NotFound`` when there is none."""
        with self._lock:
            return self._known(session_id).to_json()

    def heartbeat(self, session_id: str) -> dict[str, Any]:
        """Keep an open session alive; its json."""
        with self._lock:
            session = self.open(session_id)
            session.last_heartbeat = self._clock()
            return session.to_json()

    def close(self, session_id: str) -> dict[str, Any]:
        """Close a session and cancel its active runs; its json. Idempotent."""
        with self._lock:
            session = self._known(session_id)
            if session.status == "open":
                session.status = "closed"
                self._cancel_runs(session, "its session was closed")
            return session.to_json()

    def all(self) -> list[dict[str, Any]]:
        """Every session, open, closed or expired (their json)."""
        with self._lock:
            return [session.to_json() for session in self._sessions.values()]

    def expire_silent(self) -> list[str]:
        """Expire the open sessions whose heartbeat lapsed and cancel their runs; returns
        their ids."""
        now = self._clock()
        expired = []
        with self._lock:
            for session in self._sessions.values():
                silent = now - session.last_heartbeat
                if session.status == "open" and silent > session.heartbeat_timeout_s:
                    session.status = "expired"
                    self._cancel_runs(
                        session, f"session {session.session_id} missed its heartbeat "
                        f"(timeout {session.heartbeat_timeout_s:g} s)"
                    )
                    expired.append(session.session_id)
        return expired
