"""The WebSocket sessions an OpenEnv adapter plays its episodes on: one environment on the
server per session, up to ``concurrency`` of them at once.

OpenEnv's server builds one environment per WebSocket client and refuses a client past its
``max_concurrent_envs`` with ``CAPACITY_REACHED`` (its HTTP endpoints say nothing of the
limit). So ``SessionPool`` opens sessions only when an episode needs one and none is idle,
up to the limit asked for (``--env-arg concurrency=N``; the adapter closes all but one
after each batch, so an idle run holds one session of a shared server), and when the
server refuses one as at capacity it keeps the sessions it has: the limit becomes what
the server allows, said once on standard error. A session whose call fails for any other
reason is closed and the failure is one line naming the environment.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from posttrain.errors import PosttrainError
from posttrain.text import short_line

T = TypeVar("T")

#: what OpenEnv's client says when the server has no room for one more session
CAPACITY_CODE = "CAPACITY_REACHED"


class SessionPool:
    """Sessions opened by ``open_session()``, each used by one episode at a time."""

    def __init__(self, open_session: Callable[[], Any], limit: int, where: str) -> None:
        self.open_session = open_session
        self.limit = self.asked = limit
        self.where = where
        self._said = False
        self._idle: list[Any] = []
        self._open = 0
        self._ready = threading.Condition()

    def _slot(self) -> Any:
        """An idle session, else None with a slot reserved for a new one (while under the
        limit), else the next one freed; the caller gives it back or forgets it."""
        with self._ready:
            while not self._idle and self._open >= self.limit:
                self._ready.wait()
            if self._idle:
                return self._idle.pop()
            self._open += 1
            return None

    def _give_back(self, session: Any) -> None:
        with self._ready:
            self._idle.append(session)
            self._ready.notify()

    def _forget(self, session: Any) -> None:
        """A session that is no more: closed, its slot free."""
        with self._ready:
            self._open -= 1
            self._ready.notify()
        if session is not None:
            _close(session)

    def run(self, what: str, play: Callable[[Any], T]) -> T:
        """``play(session)`` on a session of the pool; a failure is one line naming
        ``what``. A new session the server refuses as at capacity lowers the limit to the
        sessions already open and the episode waits for one of them."""
        while True:
            session = self._slot()
            fresh = session is None
            try:
                if session is None:
                    session = self.open_session()
                result = play(session)
            except PosttrainError:  # an answer of the wrong shape: said as it is
                self._forget(session)
                raise
            except Exception as error:
                self._forget(session)
                if fresh and CAPACITY_CODE in str(error) and self._lower_limit():
                    continue
                raise PosttrainError(f"{self.where}: {what} failed: "
                                     f"{type(error).__name__}: {short_line(error)}") from None
            except BaseException:  # Ctrl-C mid-episode: the session's state is unknown
                self._forget(session)
                raise
            self._give_back(session)
            return result

    def _lower_limit(self) -> bool:
        """The server is full: play on the sessions already open (False when none is)."""
        with self._ready:
            if self._open < 1:
                return False
            self.limit = min(self.limit, self._open)
            return True

    def say_limit(self) -> None:
        """Once, on standard error: the server allows fewer sessions than were asked for."""
        if self.limit < self.asked and not self._said:
            self._said = True
            print(f"{self.where}: the server allows {self.limit} session(s) at once "
                  f"({CAPACITY_CODE} past that; asked for {self.asked}): playing "
                  f"{self.limit} episode(s) at a time", file=sys.stderr)

    def close(self, keep: int = 0) -> None:
        """Close the idle sessions but ``keep`` (the pool opens new ones when asked)."""
        with self._ready:
            idle, self._idle = self._idle[keep:], self._idle[:keep]
            self._open -= len(idle)
        for session in idle:
            _close(session)


def _close(session: Any) -> None:
    try:
        session.close()
    except Exception:  # already gone: nothing to close
        pass
