"""Stopping a run from outside: Ctrl-C and SIGTERM end it the same clean way.

A recipe catches ``KeyboardInterrupt`` to mark its run ``stopped`` and keep what was
measured. ``interruptible()`` makes SIGTERM (what ``kill``, systemd and CI runners
send) raise ``Terminated``, a ``KeyboardInterrupt``, so it takes the same path; and it
restores Python's Ctrl-C handler when the process inherited SIGINT *ignored* (a
command started with ``&`` from a non-interactive shell), so Ctrl-C does not depend on
how the run was launched.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside: SIGTERM raises ``Terminated`` and SIGINT ``KeyboardInterrupt``; both
    handlers are put back on the way out. Outside the main thread (where signals cannot
    be handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def stop_reason(interrupt: KeyboardInterrupt) -> str:
    """What the run summary says stopped it."""
    return "SIGTERM" if isinstance(interrupt, Terminated) else "Ctrl-C"
