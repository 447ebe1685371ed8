"""Deleting a run: its record in the store and its folder under the runs folder.

One function serves ``posttrain runs delete`` and the dashboard's delete button, so both
refuse the same things: a run that is still alive (its next write would bring back a
half-empty record) unless forced, and a name that could point outside the runs folder.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from posttrain.runs.ops import RunStoreError, check_run_name
from posttrain.runs.sqlite_store import SqliteRunStore


class NoSuchRun(RunStoreError):
    """Neither the store nor the runs folder has a run of that name."""


@dataclass(frozen=True)
class DeletedRun:
    """What ``delete_run`` removed."""

    name: str
    record: bool  # the store held a record of it
    folder: Path | None  # the run folder removed, if there was one

    def describe(self) -> str:
        parts = (["its record in the run store"] if self.record else []) + (
            [f"its folder {self.folder}"] if self.folder is not None else [])
        return f"deleted run {self.name!r}: " + " and ".join(parts)


def delete_run(store: SqliteRunStore, runs_root: Path, name: str, *,
               force: bool = False) -> DeletedRun:
    """Delete run ``name`` from ``store`` and remove ``<runs_root>/<name>/``.

    Raises ``RunStoreError`` when the name is unsafe, when neither a record nor a folder
    exists, or when the run is still alive and ``force`` is False (nothing is removed then).
    """
    check_run_name(name)
    folder = Path(runs_root) / name
    has_folder = folder.is_symlink() or folder.is_dir()
    record = store.delete_run(name, force=force)  # refuses a live run before anything goes
    if not record and not has_folder:
        raise NoSuchRun(f"no run named {name!r} in {store.path} or {runs_root}")
    if has_folder:
        if folder.is_symlink():  # remove the link, never what it points at
            folder.unlink()
        else:
            shutil.rmtree(folder)
    return DeletedRun(name, record, folder if has_folder else None)
