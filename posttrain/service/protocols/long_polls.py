"""One cap on long polls for every wing: ``GET /v1/training/operations/<id>?wait=`` and the
tinker SDK's ``POST /api/v1/retrieve_future`` share it.

Every handler runs on one pool of request threads (Starlette's, 40 of them). A long poll
holds its thread for the whole wait, so enough of them at once leave no thread for
anything else: ``/health`` and the very submission they wait for queue behind them. The
rule: at most ``Limits.max_long_polls`` polls wait their whole wait at once; a poll that
arrives past that waits at most ``Limits.crowded_poll_s`` and is answered as it would be
at the end of its wait (the operation still queued, or tinker's 408 try-again), so the
client simply polls again. A short wait rather than none, so that a crowd of clients
re-polling at once does not spin.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class LongPollGate:
    """Counts the long polls waiting now and says how long the next one may wait;
    thread-safe. One per server, shared by its wings (they share its threads)."""

    def __init__(self, max_long_polls: int, crowded_poll_s: float) -> None:
        self.max_long_polls = max_long_polls
        self.crowded_poll_s = crowded_poll_s
        self._lock = threading.Lock()
        self._waiting = 0

    @classmethod
    def from_limits(cls, limits: Any) -> LongPollGate:
        """The gate an engine's ``Limits`` describe (``max_long_polls``, ``crowded_poll_s``)."""
        return cls(limits.max_long_polls, limits.crowded_poll_s)

    @contextmanager
    def admit(self, wanted_s: float) -> Iterator[float]:
        """Count one poll while the block runs; yields the seconds it may wait:
        ``wanted_s``, or at most ``crowded_poll_s`` when ``max_long_polls`` wait already."""
        with self._lock:
            crowded = self._waiting >= self.max_long_polls
            self._waiting += 1
        try:
            yield min(wanted_s, self.crowded_poll_s) if crowded else wanted_s
        finally:
            with self._lock:
                self._waiting -= 1
