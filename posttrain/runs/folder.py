"""A run's folder on disk: ``<runs root>/<run name>/`` with its config, rows and report.

Layout (DESIGN.md): ``config.json``, ``summary.json``, ``holdout_before.jsonl``,
``holdout_after.jsonl``, ``adapter/``, ``report.md``, ``curves.png`` and
``metrics.jsonl``; while the run is live, ``run.lock`` (held by its process, see
``posttrain.runs.claim``). Every file is written through a temp file and a rename, so a
crash never leaves half a file; an existing run is never overwritten unless asked, and
a live one never.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.atomic import write_text_atomic
from posttrain.errors import PosttrainError
from posttrain.jsonl import write_jsonl_atomic
from posttrain.runs.claim import LOCK_FILE, RunClaim, is_live, try_claim
from posttrain.runs.ops import check_run_name
from posttrain.runs.replaced import RECORD_FILE, aside_path, discard, left_replaced

RUNS_ENV = "POSTTRAIN_RUNS"


def runs_root(explicit: str | os.PathLike | None = None) -> Path:
    """The runs folder: ``explicit``, else ``$POSTTRAIN_RUNS``, else ``./runs``.

    Raises ``PosttrainError`` when that path exists and is not a folder (say so before
    a model loads, not in a traceback when the first run file is written)."""
    source = "--runs-dir" if explicit else (f"${RUNS_ENV}" if os.environ.get(RUNS_ENV)
                                              else "the default runs folder")
    root = Path(explicit or os.environ.get(RUNS_ENV) or "runs").expanduser()
    if root.exists() and not root.is_dir():
        raise PosttrainError(f"{source} {str(root)!r} is a file, not a folder: name a folder "
                             "(it is created when missing)")
    return root


def write_json_atomic(path: Path, value: Any) -> Path:
    """Write a JSON document atomically (sorted keys, indented for people)."""
    return write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class RunFolder:
    """Paths of one run's files."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def adapter(self) -> Path:
        return self.path / "adapter"

    def write_json(self, name: str, value: Any) -> Path:
        return write_json_atomic(self.file(name), value)

    def write_text(self, name: str, text: str) -> Path:
        return write_text_atomic(self.file(name), text)

    def write_rows(self, name: str, rows: list[dict[str, Any]]) -> Path:
        return write_jsonl_atomic(self.file(name), rows)

    def read_json(self, name: str) -> Any:
        return json.loads(self.file(name).read_text(encoding="utf-8"))


@dataclass
class NewRun:
    """A run name taken before any model loads: its folder and the lock that says a
    process is writing it. ``replacing``: an existing run's lock (``--overwrite``), whose
    folder ``create_run_folder`` removes once the model has loaded."""

    folder: RunFolder
    claim: RunClaim
    replacing: bool = False
    #: the replaced run's folder, moved aside until this run ends (``create_run_folder``)
    aside: Path | None = None

    def abandon(self) -> None:
        """The run never started (its model failed to load): let the name go, removing
        the folder when it holds nothing but the lock."""
        if not self.replacing and _only_lock(self.folder.path):
            self.claim.release(remove_file=True)
            try:
                self.folder.path.rmdir()
            except OSError:
                pass  # something else was put there meanwhile: it stays
        self.claim.release()

    def finish(self, succeeded: bool = True) -> bool:
        """The run ended: let the name go (the folder keeps only its results). With a
        replaced run moved aside (``--overwrite``): on success it is removed; otherwise
        this run's folder goes and the replaced one is put back (returns True then)."""
        self.claim.release(remove_file=True)
        aside, self.aside = self.aside, None
        if aside is None:
            return False
        if succeeded:
            discard(aside)
            return False
        path = self.folder.path
        failed = path.with_name(f".{path.name}.failed-{uuid.uuid4().hex[:8]}")
        try:
            path.rename(failed)
            aside.rename(path)
        except OSError as error:
            raise PosttrainError(f"--overwrite: the new run did not finish and the run it "
                                 f"replaced could not be put back ({error.strerror or error}): "
                                 f"it is in {aside}") from None
        shutil.rmtree(failed, ignore_errors=True)
        # the lock this start took on the old folder (a finished run keeps none), and the
        # record kept in case this process was killed (the handle wrote it back)
        for leftover in (LOCK_FILE, RECORD_FILE):
            (path / leftover).unlink(missing_ok=True)
        return True


def _only_lock(path: Path) -> bool:
    try:
        return {entry.name for entry in path.iterdir()} <= {LOCK_FILE}
    except OSError:
        return False


def _live_error(name: str, path: Path) -> PosttrainError:
    return PosttrainError(
        f"run {name!r} is being written by another process (it holds {path / LOCK_FILE}): "
        "wait for it to finish, stop it (Ctrl-C), or choose another --run-name")


def check_new_run(root: Path, name: str, *, overwrite: bool = False) -> NewRun:
    """Take run name ``name`` under ``root`` before any model loads: validate it, refuse
    an existing run unless ``overwrite``, refuse a run another process is writing (even
    with ``overwrite``), and hold the folder's lock so that a second start under the same
    name is refused too. A new run's folder is created now (holding only the lock)."""
    check_run_name(name)
    folder = RunFolder(root / name)
    path = folder.path
    left = left_replaced(root, name)
    if left:  # a killed --overwrite's old run: a start must not bury it further
        raise PosttrainError(left[-1].describe() + "; then start again")
    if path.is_dir() and not path.is_symlink() and _only_lock(path):
        # a start that never got past its model load (or is loading now): free unless live
        claim = _claim_or_refuse(name, path)
        return NewRun(folder, claim)
    if path.exists() or path.is_symlink():
        if path.is_dir() and not path.is_symlink() and is_live(path):
            raise _live_error(name, path)
        if not overwrite:
            raise PosttrainError(
                f"run {name!r} already exists at {path}: choose another --run-name, "
                "or pass --overwrite to replace it"
            )
        _check_replaceable(path)  # said before any model loads
        return NewRun(folder, _claim_or_refuse(name, path), replacing=True)
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        raise _live_error(name, path) from None  # another start took the name just now
    except OSError as error:
        raise PosttrainError(f"cannot create the run folder {path} "
                             f"({error.strerror or error})") from None
    return NewRun(folder, _claim_or_refuse(name, path))


def _claim_or_refuse(name: str, path: Path) -> RunClaim:
    try:
        claim = try_claim(path)
    except OSError as error:
        raise PosttrainError(f"cannot write in the run folder {path} "
                             f"({error.strerror or error})") from None
    if claim is None:
        raise _live_error(name, path)
    return claim


def _check_replaceable(path: Path) -> None:
    if path.is_symlink() or not is_run_folder(path):
        raise PosttrainError(
            f"--overwrite: {path} is not a posttrain run (no config.json naming a recipe), "
            "so it is not removed: choose another --run-name or --runs-dir")


def is_run_folder(path: Path) -> bool:
    """Did posttrain make this folder for a run? Its ``config.json`` names a recipe and
    its settings (what every run writes first). Destructive commands touch nothing else."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "recipe" in config and "settings" in config


def folder_config(path: Path) -> dict[str, Any] | None:
    """The run folder's ``config.json`` as an object, or None."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def record_made_folder(path: Path, record_config: Any) -> bool:
    """Was the store's record of a run written by the run that made the folder at
    ``path``? Every recipe puts one ``run_id`` in both its ``config.json`` and the record it
    creates; a record another process ingested for the same name (a folder copied in, a
    dashboard on a second store, a name claimed after a store was rebuilt) does not know
    it (the folder's config is served nowhere before its run's record exists). A folder
    from before run ids proves it by holding the record's config (``LEGACY_PROOF_KEYS``)."""
    config = folder_config(path)
    if config is None or not isinstance(record_config, dict):
        return False
    if "run_id" in config:
        return record_config.get("run_id") == config["run_id"]
    if record_config == config:
        return True
    # a run that added to its config.json after its record (a cold start's shape did)
    return all(key in config and record_config.get(key) == config[key]
               for key in LEGACY_PROOF_KEYS)


#: what a record of a run from before run ids must hold exactly as its folder's config
#: does (the recipe, every setting, what it resolved, its data and library versions)
LEGACY_PROOF_KEYS = ("recipe", "settings", "resolved", "data", "versions")


def create_run_folder(new: NewRun) -> RunFolder:
    """Make the run's folder ready for its files, once the model has loaded: a replaced
    run's folder is moved aside (``.<name>.replaced-<id>``, put back by ``NewRun.finish``
    when this run does not succeed) and made anew (its lock taken over); a new run's
    folder exists already."""
    if not new.replacing:
        return new.folder
    path = new.folder.path
    _check_replaceable(path)
    # the replaced run is moved aside, not removed: it comes back if this run fails
    aside = aside_path(path)
    try:
        path.rename(aside)
        path.mkdir(parents=True)
    except FileExistsError:
        raise _live_error(new.folder.name, path) from None
    except OSError as error:
        if aside.exists() and not path.exists():
            aside.rename(path)
        raise PosttrainError(f"--overwrite: could not replace {path} "
                             f"({error.strerror or error}); the run there is kept") from None
    new.aside = aside
    old = new.claim
    new.claim = _claim_or_refuse(new.folder.name, path)
    new.replacing = False
    old.release()
    return new.folder


def find_run(root: Path, name: str) -> RunFolder:
    """An existing run folder, or a ``PosttrainError`` that lists the runs there."""
    check_run_name(name)
    folder = RunFolder(root / name)
    if not folder.path.is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        listing = ", ".join(known[:10]) if known else "none"
        raise PosttrainError(f"no run {name!r} in {root} (runs there: {listing})")
    return folder


def from_run_base_model(root: Path, name: str, asked: str | None) -> str | None:
    """The base model for ``--from-run NAME``: the one that run trained on. ``asked`` (the
    ``--base-model`` flag) must be that one, or None; a run with no record of its base
    model leaves ``asked`` as it is."""
    config_path = find_run(root, name).file("config.json")
    try:
        trained_on = json.loads(config_path.read_text())["settings"]["base_model"]
    except (OSError, ValueError, KeyError, TypeError):
        return asked
    if not isinstance(trained_on, str):
        return asked
    if asked is not None and asked != trained_on:
        raise PosttrainError(
            f"--from-run {name} trained its adapter on {trained_on!r}, which does not fit "
            f"--base-model {asked!r}: leave --base-model out (it follows the run) or pass "
            f"--base-model {trained_on}"
        )
    return trained_on
