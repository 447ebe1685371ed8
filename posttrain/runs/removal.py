"""Deleting a run: its record in the store and its folder under the runs folder.

One function serves ``posttrain runs delete`` and the dashboard's delete button, so both
refuse the same things: a run that is still alive (its next write would bring back a
half-empty record) unless forced, a name that could point outside the runs folder, and a
folder posttrain did not make for a run (``runs.folder.is_run_folder``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from posttrain.access import ADMIN, Caller
from posttrain.runs.claim import LOCK_FILE, is_live
from posttrain.runs.folder import is_run_folder, record_made_folder
from posttrain.runs.ops import RunStillAlive, RunStoreError, check_run_name
from posttrain.runs.sql import check_owner
from posttrain.runs.sql_store import SqlRunStore


class NoSuchRun(RunStoreError):
    """Neither the store nor the runs folder has a run of that name. ``public``: the same
    without this machine's paths, for a server's answer to a remote caller."""

    def __init__(self, message: str, public: str) -> None:
        super().__init__(message)
        self.public = public


@dataclass(frozen=True)
class DeletedRun:
    """What ``delete_run`` removed."""

    name: str
    record: bool  # the store held a record of it
    folder: Path | None  # the run folder removed, if there was one
    kept: Path | None = None  # a folder of that name that is no run's, left in place

    def describe(self) -> str:
        parts = (["its record in the run store"] if self.record else []) + (
            [f"its folder {self.folder}"] if self.folder is not None else [])
        line = f"deleted run {self.name!r}: " + " and ".join(parts)
        if self.kept is not None:
            line += (f"; {self.kept} stays: it holds no config.json of the run this record "
                     "is of (no run's at all, or another's: its run id differs), so the "
                     "record's run did not make it")
        return line


def delete_run(store: SqlRunStore, runs_root: Path, name: str, *,
               force: bool = False, caller: Caller = ADMIN) -> DeletedRun:
    """Delete run ``name``: ``<runs_root>/<name>/`` first, then its record in ``store`` (so a
    removal that fails part-way leaves a record to delete again).

    A folder is removed only when it holds a run's ``config.json`` (``is_run_folder``):
    a record in the store alone never makes a folder deletable (records can be ingested by
    anyone with write access; a folder of the same name that posttrain did not make for a
    run stays, and only the record goes). With neither, nothing is deleted.
    Raises ``RunStoreError`` when the name is unsafe, when there is no run of that name,
    when the run is still alive and ``force`` is False, or when the folder cannot be
    removed (the record is kept then). A ``caller`` from a tokens file deletes only the
    runs it created (``NotYours``, before anything is removed).
    """
    check_run_name(name)
    folder = Path(runs_root) / name
    has_folder = folder.is_symlink() or folder.is_dir()
    known = store.get_run(name)
    check_owner(name, known["owner"] if known is not None else None, caller)
    if has_folder and not folder.is_symlink() and is_live(folder):  # force cannot override:
        # the process is certainly there, and its next write would bring the run back
        raise RunStillAlive(
            f"run {name!r} is being written by a process that holds {folder / LOCK_FILE}: "
            "stop it first (Ctrl-C), then delete it")
    if known is not None and known["status"] == "running" and not force:
        raise RunStillAlive(
            f"run {name!r} is still running; stop it first (Ctrl-C), wait until it shows as "
            "lost, or force the deletion")
    # a folder is the run's only when posttrain wrote a run's config there (a link: when
    # what it points at is one); a store record alone proves nothing, since anyone who may
    # write to the store can claim a name (an ingested create for a folder that exists)
    # and, when the store has a record, only when that record was written by the run that
    # made the folder (its run_id): another's record of the name cannot take the folder
    is_run = has_folder and is_run_folder(folder) and (
        known is None or record_made_folder(folder, known.get("config")))
    if known is None and not is_run:
        if has_folder:
            raise NoSuchRun(f"{folder} is not a posttrain run (no record in {store.location}, no "
                            "config.json naming a recipe): nothing was deleted",
                            public=f"{name!r} is not a posttrain run (no record in the store, "
                                   "no config.json naming a recipe): nothing was deleted")
        raise NoSuchRun(f"no run named {name!r} in {store.location} or {runs_root}",
                        public=f"no run named {name!r}")
    if is_run:
        try:
            if folder.is_symlink():  # remove the link, never what it points at
                folder.unlink()
            else:
                shutil.rmtree(folder)
        except OSError as error:
            raise RunStoreError(
                f"could not remove {folder} ({error.strerror or error}): part of it may be "
                f"left; its record is kept, so deleting {name!r} again retries") from None
    record = store.delete_run(name, force=True, caller=caller) if known is not None else False
    return DeletedRun(name, record, folder if is_run else None,
                      kept=folder if has_folder and not is_run else None)
