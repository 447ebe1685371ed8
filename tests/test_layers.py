"""The package's floors and its lack of import cycles, held by import-linter (.importlinter).

The contracts run on the real tree, and on a copy with a planted upward import and a
planted cycle, to show that a break fails the test command rather than passing unseen;
likewise the service's wings (engine, protocols, client) with a planted import from the
client into the engine and one between two protocol wings.
Function-local imports of posttrain modules are allowed only where the imported module
needs an optional extra, each with a comment that says so.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# the bound ("One house"): at most 20, each for an optional dependency
MAX_DEFERRED_IMPORTS = 20


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """Run import-linter on ``tree`` (a folder holding ``.importlinter`` and ``posttrain/``)."""
    # PYTHONPATH first, so the root package resolved is the tree's own copy
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


def _copy_of_package(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    shutil.copytree(ROOT / "posttrain", tree / "posttrain",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _plant(module: Path, line: str) -> None:
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text
    module.write_text(text.replace(marker, marker + line + "\n", 1))


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_the_contracts_hold_on_the_tree():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_upward_import_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # the environment contract (floor 1) reaching up into the trainers (floor 6)
    _plant(tree / "posttrain/envs/base.py", "from posttrain.train import settings  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "posttrain.envs is not allowed to import posttrain.train" in result.stdout
    assert "posttrain.envs.base -> posttrain.train.settings" in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_cycle_inside_a_package_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # stats is the bottom of score; passat imports it, so this closes a loop
    _plant(tree / "posttrain/score/stats.py", "from posttrain.score import passat  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "No cycles are allowed in posttrain.score." in result.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_import_from_the_service_client_into_the_engine_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # the client runs on the caller's machine without torch: it may not reach the engine
    _plant(tree / "posttrain/service/client/service_client.py",
           "from posttrain.service.engine import losses  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())  # import-linter wraps its lines at 80 columns
    assert "posttrain.service.client is not allowed to import posttrain.service.engine" \
        in report
    assert "posttrain.service.client.service_client -> posttrain.service.engine.losses" \
        in report
    assert "the service's client never imports its server side" in report


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_import_between_two_protocol_wings_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # each wing translates its own wire format onto the engine; none borrows another's
    _plant(tree / "posttrain/service/protocols/tinker/training.py",
           "from posttrain.service.protocols.native import parsing  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())  # import-linter wraps its lines at 80 columns
    assert "posttrain.service.protocols.tinker is not allowed to import " \
        "posttrain.service.protocols.native" in report
    assert "posttrain.service.protocols.tinker.training -> " \
        "posttrain.service.protocols.native.parsing" in report


def test_the_service_client_imports_without_torch_or_the_server_extras():
    """The client wing runs on the caller's machine: importing it, through the package's
    ``__init__`` as a caller does, needs neither torch nor the HTTP servers' extra."""
    code = ("import sys\n"
            "for name in ('torch', 'transformers', 'peft', 'starlette', 'uvicorn'):\n"
            "    sys.modules[name] = None  # any import of them now fails\n"
            "import posttrain.service.client.algorithms\n"
            "from posttrain.service import AdamParams, ServiceClient, run_rl_loop\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _deferred_posttrain_imports() -> list[tuple[Path, int, str]]:
    """Every ``from posttrain... import`` inside a function: (file, line, the line above)."""
    found = []
    for path in sorted((ROOT / "posttrain").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if (isinstance(inner, ast.ImportFrom) and inner.module
                        and inner.module.startswith("posttrain")):
                    found.append((path, inner.lineno, lines[inner.lineno - 2].strip()))
    return found


def test_deferred_imports_are_few_and_each_says_why():
    deferred = _deferred_posttrain_imports()
    assert len(deferred) <= MAX_DEFERRED_IMPORTS, deferred
    for path, line, above in deferred:
        assert above.startswith("#"), (
            f"{path.relative_to(ROOT)}:{line}: a function-local posttrain import needs a "
            "comment on the line above saying which optional dependency it defers")


def test_docs_layout_names_every_module():
    # docs/layout.md is the newcomer's map: a module it does not name is a room nobody finds
    text = (ROOT / "docs/layout.md").read_text()
    missing = []
    for path in sorted((ROOT / "posttrain").rglob("*.py")):
        relative = path.relative_to(ROOT / "posttrain").as_posix()
        if path.name == "__init__.py" and relative != "__init__.py":
            continue
        # grouped rows name the first module by path and the rest by file name
        if f"`{relative}`" not in text and not (f"`{path.name}`" in text
                                                 or f" {path.name}`" in text):
            missing.append(relative)
    assert missing == []
