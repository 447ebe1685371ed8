"""Stopping a run from outside: Ctrl-C and SIGTERM end it the same clean way.

A recipe catches ``KeyboardInterrupt`` to mark its run ``stopped`` and keep what was
measured. ``interruptible()`` makes SIGTERM (what ``kill``, systemd and CI runners
send) raise ``Terminated``, a ``KeyboardInterrupt``, so it takes the same path; and it
restores Ctrl-C when the process inherited SIGINT *ignored* (a command started with
``&`` from a non-interactive shell), so Ctrl-C does not depend on how the run was
launched.

A signal's exception is raised wherever the main thread happens to be, and when that is
a weakref callback or a ``__del__`` (garbage collection runs them at any moment) Python
prints "Exception ignored" and carries on: the Ctrl-C is lost and the run finishes as if
nobody had asked. So the handlers also *latch* the interrupt until code that handles it
says so (``handled``); long work calls ``raise_if_interrupted()`` at its checkpoints (every
progress update, so every evaluation batch and training step), and ``interruptible()``
raises a latched interrupt on its way out at the latest.
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


#: The interrupt a signal raised that no code has handled yet (empty, or one kind). Signals
#: belong to the process, so this is module state by necessity: a handler has nowhere
#: else to put what it saw.
_latched: list[type[KeyboardInterrupt]] = []


def _raise_interrupt(kind: type[KeyboardInterrupt]) -> None:
    _latched[:] = [kind]
    raise kind()


def _on_sigterm(signum: int, frame: Any) -> None:
    _raise_interrupt(Terminated)


def _on_sigint(signum: int, frame: Any) -> None:
    _raise_interrupt(KeyboardInterrupt)


def raise_if_interrupted() -> None:
    """A checkpoint: raise the interrupt a signal raised where nobody could see it (see
    the module's note). Only in the main thread, where signals are handled; a no-op
    elsewhere and when no signal came."""
    if _latched and threading.current_thread() is threading.main_thread():
        raise _latched[0]()


def handled(interrupt: KeyboardInterrupt) -> str:
    """Say the interrupt was dealt with (a checkpoint raises it no more) and return what
    the run summary says stopped it."""
    _latched.clear()
    return "SIGTERM" if isinstance(interrupt, Terminated) else "Ctrl-C"


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside: SIGTERM raises ``Terminated`` and SIGINT ``KeyboardInterrupt``; both
    handlers are put back on the way out, and an interrupt that was lost inside (see the
    module's note) is raised then. Outside the main thread (where signals cannot be
    handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_int = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        _latched.clear()  # it reached the caller, who handles it
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    if _latched:
        kind = _latched.pop()
        raise kind()
