"""Writing the files a user names, the way command-line tools do.

A regular file (or a name not taken yet) is written atomically: a temp file in
the same folder, then a rename, so a crash or an exception mid-write leaves the
previous file (or none), never half a file, and no temp file behind. Files get
the usual permissions (0666 minus the umask), not the 0600 of a bare temp file.

What is not a regular file is never replaced: a symlink is followed (its target
is written, the link stays), and a device or FIFO is written into, as ``>`` in a
shell would (``--out /dev/stdout`` and ``/dev/null`` work; ``/dev/full`` says
the device is full instead of being swapped for a file). A folder, a path under
a file, or a folder that cannot be written is refused with one line, and
``check_output_path`` says so before any work starts.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from posttrain.errors import PosttrainError


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _is_special(path: Path) -> bool:
    """True for an existing device, FIFO or socket: written into, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _first_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _os_error_line(path: Path, error: OSError) -> str:
    reason = error.strerror or str(error)
    if error.errno == errno.ENOSPC:
        reason = "no space left on the device"
    return f"cannot write {path}: {reason}"


def check_output_path(path: str | os.PathLike, *, what: str = "output",
                      not_same_as: Iterable[object] = ()) -> Path:
    """Refuse, with one line, an output path that cannot be written; before any work.

    ``not_same_as`` names files the output must never overwrite (the run store,
    an input of the same command). Returns the path writes will go to (a
    symlink's target).
    """
    given = Path(path)
    if str(path) == "":
        raise PosttrainError(f"the {what} path is empty: give a file name to write to")
    target = Path(os.path.realpath(given))
    if target.is_dir():
        raise PosttrainError(f"{what} {given} is a folder: give a file name to write to")
    for other in not_same_as:
        if not isinstance(other, (str, os.PathLike)) or not other:
            continue  # an optional input the command was not given
        if Path(os.path.realpath(other)) == target:
            raise PosttrainError(f"{what} {given} is {other}, which this command reads: "
                                 "give another file name")
    if _is_special(target):
        if not os.access(target, os.W_OK):
            raise PosttrainError(f"cannot write {given}: permission denied")
        return target
    existing = _first_existing(target.parent)
    if not existing.is_dir():
        raise PosttrainError(f"cannot write {given}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PosttrainError(f"cannot write {given}: the folder {existing} is not writable")
    return target


@contextmanager
def _write_into(path: Path, target: Path, mode: str) -> Iterator[IO]:
    encoding = None if "b" in mode else "utf-8"
    try:
        handle = open(target, mode, encoding=encoding)
    except OSError as error:
        raise PosttrainError(_os_error_line(path, error)) from None
    try:
        yield handle
        handle.close()  # a full device reports on the final flush
    except OSError as error:
        raise PosttrainError(_os_error_line(path, error)) from None
    finally:
        if not handle.closed:
            try:
                handle.close()
            except OSError:
                pass  # the write's own error is the one to report


@contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open ``path`` for writing: atomically for a regular file, straight into a device.

    A symlink is followed, so its target changes and the link stays.
    """
    given = Path(path)
    target = check_output_path(given)
    if _is_special(target):
        with _write_into(given, target, mode) as handle:
            yield handle
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as error:  # e.g. /proc: the file exists but nothing can be made beside it
        raise PosttrainError(f"cannot write {given}: no new file can be made in "
                             f"{target.parent} ({error.strerror or error})") from None
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
        os.chmod(temp, 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException as error:
        if os.path.exists(temp):
            os.unlink(temp)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise PosttrainError(_os_error_line(given, error)) from None
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (see ``atomic_writer``); returns the path."""
    with atomic_writer(path) as handle:
        handle.write(text)
    return Path(path)
