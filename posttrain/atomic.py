"""Atomic file writes: a temp file in the same folder, then a rename.

A crash or an exception mid-write leaves the previous file (or none), never half
a file, and no temp file behind. Files get the usual permissions (0666 minus the
umask), not the 0600 of a bare temp file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from posttrain.errors import PosttrainError


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file beside ``path`` for writing; it replaces ``path`` on success."""
    path = Path(path)
    if path.is_dir():
        raise PosttrainError(f"{path} is a folder: give a file name to write to")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
        os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_writer(path) as handle:
        handle.write(text)
    return Path(path)
