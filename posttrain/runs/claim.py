"""Who is writing a run folder: an advisory lock its process holds for the run's life.

A recipe takes an exclusive ``flock`` on ``<run>/run.lock`` before its model loads and
holds it until the run ends; the kernel drops it when the process dies (``kill -9``
too), so "is this run live?" is answered by trying the lock, not by guessing from a pid
or a heartbeat. A second start under the same name, ``--overwrite`` and ``runs delete``
all ask it, so none of them can remove or share a folder another process is writing.
POSIX only (``fcntl``), like the rest of the run folder's guarantees.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "run.lock"


class RunClaim:
    """The held lock of one run folder; ``release`` (or the process's end) lets it go."""

    def __init__(self, folder: Path, fd: int, lock_file: str = LOCK_FILE) -> None:
        self.folder = folder
        self.lock_file = lock_file
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, *, remove_file: bool = False) -> None:
        """Let go of the lock; ``remove_file`` also removes ``run.lock`` (a finished run's
        folder then holds only its results)."""
        if self._fd is None:
            return
        if remove_file:
            try:
                (self.folder / self.lock_file).unlink()
            except OSError:
                pass  # the folder was removed or is read-only now: the lock goes anyway
        os.close(self._fd)
        self._fd = None


def try_claim(folder: Path, lock_file: str = LOCK_FILE) -> RunClaim | None:
    """Take ``folder``'s lock (creating ``lock_file``, a run's ``run.lock`` by default);
    None when another process holds it.

    Raises ``OSError`` when the lock file cannot be created (a read-only folder)."""
    fd = os.open(folder / lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return RunClaim(folder, fd, lock_file)


def is_live(folder: Path) -> bool:
    """Does a process hold ``folder``'s run lock now (a run being written)?"""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no run of this posttrain is writing here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return False
