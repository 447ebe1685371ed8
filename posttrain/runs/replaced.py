"""The run ``--overwrite`` replaces, kept until the new run is ``done``.

A start with ``--overwrite`` moves the old run's folder aside (``.<name>.replaced-<id>``)
and, before the new run's record takes the old one's place in a SQL store, writes the old
record into that folder (``RECORD_FILE``: the ops that replay it). The new run's success
discards it; its failure puts both back. A process killed in between (SIGKILL, a lost
machine) leaves the folder aside and nothing else: ``left_replaced`` finds it once no
process holds its lock or the name's, ``posttrain runs list`` shows it, a new start of
that name is refused until it is dealt with, and ``posttrain runs restore NAME`` puts the
old run back under its name (folder and record) or, with ``--discard``, drops it.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.atomic import write_text_atomic
from posttrain.errors import PosttrainError
from posttrain.runs.claim import LOCK_FILE, is_live, try_claim

#: the old run's record, in its folder while it is aside
RECORD_FILE = "replaced-record.json"
_ASIDE = ".replaced-"
_DISCARDED = ".discarded-"


def aside_path(path: Path) -> Path:
    """Where ``--overwrite`` moves the run folder ``path`` while its replacement runs."""
    return path.with_name(f".{path.name}{_ASIDE}{uuid.uuid4().hex[:8]}")


def save_record(aside: Path, ops: list[dict[str, Any]], owner: str | None) -> None:
    """Keep the replaced run's record (the ops that replay it) in its folder aside, written
    whole or not at all, before the new run's record replaces it in the store."""
    write_text_atomic(aside / RECORD_FILE,
                      json.dumps({"owner": owner, "ops": ops}, allow_nan=False))


def discard(aside: Path) -> None:
    """The new run is done: the replaced folder goes. Renamed first, so that a process
    killed while removing it never leaves half a run that looks restorable."""
    gone = aside.with_name(aside.name.replace(_ASIDE, _DISCARDED, 1))
    try:
        aside.rename(gone)
    except OSError:
        gone = aside
    shutil.rmtree(gone, ignore_errors=True)


@dataclass
class LeftReplaced:
    """A replaced run left aside by a process that ended before its replacement did."""

    name: str
    aside: Path
    has_record: bool

    def describe(self) -> str:
        return (f"run {self.name!r}: the run --overwrite was replacing is kept in "
                f"{self.aside} (the replacing process ended before its run finished): "
                f"'posttrain runs restore {self.name}' puts it back"
                + (" with its record" if self.has_record else "")
                + f", 'posttrain runs restore {self.name} --discard' drops it")


def left_replaced(root: Path, name: str | None = None) -> list[LeftReplaced]:
    """Replaced runs under ``root`` (of run ``name``, or of every name) that no live
    process is replacing now, oldest first. Half-removed discarded folders are cleared."""
    if not root.is_dir():
        return []
    found = []
    prefix = f".{name}{_ASIDE}" if name is not None else "."
    for entry in sorted(root.iterdir(), key=_mtime):
        if not entry.is_dir() or entry.is_symlink() or not entry.name.startswith(prefix):
            continue
        if _DISCARDED in entry.name and not is_live(entry):
            shutil.rmtree(entry, ignore_errors=True)
            continue
        owner_name, mark, _ = entry.name[1:].rpartition(_ASIDE)
        if not mark or not owner_name:
            continue
        if is_live(entry) or is_live(root / owner_name):
            continue  # its replacement is running now: it is not left over
        found.append(LeftReplaced(owner_name, entry, (entry / RECORD_FILE).is_file()))
    return found


def restore(root: Path, name: str, store: Any | None) -> str:
    """Put the replaced run of ``name`` back under its name: the interrupted run's folder
    (and record) go, the old folder returns, and its saved record is written back into
    ``store`` (a SQL store; None when there is none to write to)."""
    chosen = _the_left(root, name)
    record = _read_record(chosen.aside)
    path = root / name
    if record is not None and store is None:
        raise PosttrainError(f"the run kept in {chosen.aside} has a record to put back, and "
                             "there is no run store to write it to: pass --store")
    claim = None
    if path.is_dir() and not path.is_symlink():
        claim = try_claim(path)
        if claim is None:
            raise PosttrainError(f"run {name!r} is being written by another process (it "
                                 f"holds {path / LOCK_FILE}): stop it first")
    elif path.exists() or path.is_symlink():
        raise PosttrainError(f"{path} is not a run folder; move it away, then restore")
    try:
        if path.exists():
            failed = path.with_name(f".{name}.failed-{uuid.uuid4().hex[:8]}")
            path.rename(failed)
            shutil.rmtree(failed, ignore_errors=True)
        chosen.aside.rename(path)
    except OSError as error:
        raise PosttrainError(f"could not put {chosen.aside} back as {path} "
                             f"({error.strerror or error}); it is kept where it is") from None
    finally:
        if claim is not None:
            claim.release()
    if record is not None:
        store.apply(record["ops"], owner=record["owner"])
    for leftover in (RECORD_FILE, LOCK_FILE):
        (path / leftover).unlink(missing_ok=True)
    what = "its folder and record" if record is not None else "its folder"
    return f"restored run {name!r} ({what}) to {path}"


def drop(root: Path, name: str) -> str:
    """Remove the replaced run of ``name`` kept aside (the interrupted run stays)."""
    chosen = _the_left(root, name)
    discard(chosen.aside)
    return f"dropped the replaced run of {name!r} kept in {chosen.aside}"


def _the_left(root: Path, name: str) -> LeftReplaced:
    left = left_replaced(root, name)
    if not left:
        raise PosttrainError(f"no replaced run of {name!r} is kept in {root} (a run "
                             "--overwrite replaced is kept only until the new run finishes)")
    return left[-1]  # the newest, if a name was ever left aside twice


def _read_record(aside: Path) -> dict[str, Any] | None:
    """The saved record, checked: an object holding an owner and a list of ops."""
    file = aside / RECORD_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PosttrainError(f"{file}: not a readable record ({error}); move the file "
                             "away to restore the folder alone") from None
    if (not isinstance(record, dict) or not isinstance(record.get("ops"), list)
            or not (record.get("owner") is None or isinstance(record.get("owner"), str))):
        raise PosttrainError(f"{file}: field 'ops' must be a list and 'owner' a name or "
                             "null; move the file away to restore the folder alone")
    return record


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
