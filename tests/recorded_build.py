"""Build one of the test sessions' models and write down what the build read (the
record ``tests/model_cache.py`` keeps it by)::

    POSTTRAIN_MODELS=FOLDER python -m tests.recorded_build NAME RECORD_FILE

NAME is one of ``BUILDS``, or ``module:function`` for a function that makes a folder
under ``POSTTRAIN_MODELS`` and returns it (the recorder's own test uses one).

What "read" means: every module of ``posttrain/`` or ``examples/`` imported in this process,
every file under them opened, every folder under them listed, and every installed
distribution imported. Python's audit hooks report each ``open`` and each listing as it
happens; the hook is installed before anything of the package is imported, and this
process imports nothing else, so the record names the build's reads and only them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tests.model_cache import LIBRARY_FLAG, REPO, record_of, source_path

# Each build imports the package inside its function: the audit hook must be in place
# before the first module of the package is imported (``main``), not to dodge a cycle.


def _starter_2m() -> Path:
    from posttrain.policy.starters.build import build_starter

    return build_starter("starter-2m", show_progress=False)


def _library_starter() -> Path:
    from posttrain.policy.starters.build import build_starter

    return build_starter("starter", env=LIBRARY_FLAG, show_progress=False)


def _smollm2() -> Path:
    from posttrain.policy.models import gguf_folder, smollm2_gguf

    return gguf_folder(smollm2_gguf())


#: the models the suite's fixtures share, by the name their records go under
BUILDS: dict[str, Callable[[], Path]] = {
    "starter-2m": _starter_2m,
    "library-starter": _library_starter,
    "smollm2": _smollm2,
}


def build_for(name: str) -> Callable[[], Path]:
    """The build ``name`` names: one of ``BUILDS`` or ``module:function``."""
    if name in BUILDS:
        return BUILDS[name]
    module, _, function = name.partition(":")
    if not function:
        raise SystemExit(f"unknown test model {name!r}: one of {', '.join(BUILDS)}, "
                         "or module:function")
    return getattr(importlib.import_module(module), function)


class ReadLog:
    """The source files opened and the source folders listed, as the audit hook hears
    them (paths relative to the repository; anything outside ``SOURCE_TREES`` is
    ignored)."""

    def __init__(self) -> None:
        self.opened: set[str] = set()
        self.listed: set[str] = set()

    def hear(self, event: str, args: tuple) -> None:
        if event == "open":
            self._note(args[0], self.opened)
        elif event in ("os.listdir", "os.scandir"):
            self._note(args[0] if args[0] is not None else ".", self.listed)

    @staticmethod
    def _note(path: object, into: set[str]) -> None:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, (str, os.PathLike)):
            relative = source_path(os.fspath(path))
            if relative is not None:
                into.add(relative)


def imported_sources() -> set[str]:
    """The source files of the package's and the examples' modules imported so far."""
    files = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and (relative := source_path(file)) is not None:
            files.add(relative)
    return files


def imported_distributions() -> set[str]:
    """The installed distributions whose top-level modules are imported."""
    owners = importlib.metadata.packages_distributions()
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    return {owner for top in tops for owner in owners.get(top, ())}


def main(arguments: list[str]) -> int:
    if len(arguments) != 2:
        raise SystemExit(__doc__)
    name, record_file = arguments
    log = ReadLog()
    sys.addaudithook(log.hear)
    build = build_for(name)
    folder = Path(build()).resolve()
    models = Path(os.environ["POSTTRAIN_MODELS"]).resolve()
    entry = folder.relative_to(models).as_posix()
    if entry.count("/") != 1:
        raise SystemExit(f"{folder} is not a model folder under {models}/KIND/")
    files = {path for path in imported_sources() | log.opened if (REPO / path).is_file()}
    folders = {path for path in log.listed if (REPO / path).is_dir()}
    record = record_of([entry], files, folders, imported_distributions())
    Path(record_file).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
