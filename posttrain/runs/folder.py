"""A run's folder on disk: ``<runs root>/<run name>/`` with its config, rows and report.

Layout (DESIGN.md): ``config.json``, ``summary.json``, ``holdout_before.jsonl``,
``holdout_after.jsonl``, ``adapter/``, ``report.md``, ``curves.png`` and
``metrics.jsonl``. Every file is written through a temp file and a rename, so a
crash never leaves half a file; an existing run is never overwritten unless asked.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.atomic import write_text_atomic
from posttrain.errors import PosttrainError
from posttrain.jsonl import write_jsonl_atomic
from posttrain.runs.ops import check_run_name

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


def check_new_run(root: Path, name: str, *, overwrite: bool = False) -> RunFolder:
    """Validate a run name and refuse an existing run unless ``overwrite``; creates nothing."""
    check_run_name(name)
    folder = RunFolder(root / name)
    if folder.path.exists() and not overwrite:
        raise PosttrainError(
            f"run {name!r} already exists at {folder.path}: choose another --run-name, "
            "or pass --overwrite to replace it"
        )
    if folder.path.exists() or folder.path.is_symlink():
        _check_replaceable(folder.path)  # said before any model loads
    return folder


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


def create_run_folder(folder: RunFolder, *, overwrite: bool = False) -> RunFolder:
    """Create the folder (an existing run's is removed first when ``overwrite``; a folder
    that is not a run's is never removed)."""
    if folder.path.exists() and overwrite:
        _check_replaceable(folder.path)
        shutil.rmtree(folder.path)
    folder.path.mkdir(parents=True, exist_ok=False)
    return folder


def find_run(root: Path, name: str) -> RunFolder:
    """An existing run folder, or a ``PosttrainError`` that lists the runs there."""
    check_run_name(name)
    folder = RunFolder(root / name)
    if not folder.path.is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        listing = ", ".join(known[:10]) if known else "none"
        raise PosttrainError(f"no run {name!r} in {root} (runs there: {listing})")
    return folder
