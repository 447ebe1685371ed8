"""The package's floors and its lack of import cycles, held by import-linter (.importlinter).

The contracts run on the real tree, and on a copy with a planted upward import and a
planted cycle, to show that a break fails the test command rather than passing unseen;
likewise the service's wings (engine, protocols, client) with a planted import from the
client into the engine and one between two protocol wings, the recipes' rooms with a
planted import of GRPO's room into the shared phases, and a recipe's step with a planted
import of its route. Two things import-linter does not
see are checked here: a package's ``__init__`` (its face) in an import loop, and the
string registries (lazy exports, subcommands, built-in environments) naming what exists.
Function-local imports of posttrain modules are allowed only where the imported module
needs an optional extra, each with a comment that says so.
"""

from __future__ import annotations

import ast
import importlib
import json
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
    assert "Contracts: 8 kept, 0 broken." in result.stdout


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


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_import_of_a_recipe_into_the_shared_phases_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # the phases every recipe shares may not know one recipe's room
    _plant(tree / "posttrain/train/recipe.py", "from posttrain.train.grpo import monitor  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())  # import-linter wraps its lines at 80 columns
    assert "posttrain.train.recipe is not allowed to import posttrain.train.grpo" in report
    assert "nothing shared imports a recipe" in report


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is in the dev extra")
def test_a_planted_import_of_a_recipes_route_into_its_step_is_caught(tmp_path):
    tree = _copy_of_package(tmp_path)
    # the step (trainer.py) is what the route (run.py) calls; never the other way round
    _plant(tree / "posttrain/train/sft/trainer.py", "from posttrain.train.sft import run  # noqa")
    result = _lint_imports(tree)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())
    assert "posttrain.train.sft.trainer is not allowed to import posttrain.train.sft.run" \
        in report
    assert "the step never imports its route" in report


def _module_names(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name; a package is its ``__init__``."""
    names = {}
    for path in (root / "posttrain").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imports_counting_faces(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The posttrain modules ``name`` imports, where ``from PACKAGE import x`` counts as
    importing the package's face (its ``__init__``, which Python runs and reads for
    ``x``) as well as the submodule ``x`` when there is one. import-linter counts only the
    submodule, so a face that imports its submodules while they import it looks clean."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in modules and module != name}


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return loops


def test_no_package_face_is_in_an_import_loop():
    """No loop in the import graph once a package's ``__init__`` counts as a module (the
    engine's submodules imported the engine's face, which imported them)."""
    modules = _module_names(ROOT)
    graph = {name: _imports_counting_faces(name, path, modules)
             for name, path in modules.items()}
    assert len(graph) > 150  # the whole package was read
    assert _loops(graph) == []


def test_the_loop_finder_sees_a_face_loop(tmp_path):
    """The check above can fail: a face importing its submodule, which imports the face."""
    tree = tmp_path / "tree"
    package = tree / "posttrain" / "pack"
    package.mkdir(parents=True)
    (tree / "posttrain" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from posttrain.pack.inner import thing\n")
    (package / "inner.py").write_text("from posttrain.pack import other\nthing = 1\n")
    (package / "other.py").write_text("")
    modules = _module_names(tree)
    graph = {name: _imports_counting_faces(name, path, modules)
             for name, path in modules.items()}
    assert _loops(graph) == [["posttrain.pack", "posttrain.pack.inner"]]


def _top_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported (not inside a function)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_package_face_loads_its_own_submodules():
    """Python runs a package's ``__init__`` before any module under it: a face that
    imports its own submodules loads them for whoever imports any one of them (importing
    ``posttrain.envs.base`` loaded the 16 ecosystem adapters) and forms a loop with them.
    Every face re-exports lazily (``posttrain.lazy_exports``)."""
    modules = _module_names(ROOT)
    eager = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        # the helper every face is made with imports nothing of the package
        own = sorted(module for module in _top_level_imports(path)
                     if module.startswith(f"{name}.") and module in modules
                     and module != "posttrain.lazy_exports")
        if own:
            eager[name] = own
    assert eager == {}


def _posttrain_modules_loaded_by(module: str) -> list[str]:
    """The posttrain modules a fresh interpreter holds after ``import module``."""
    code = (f"import sys, json\nimport {module}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('posttrain'))))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("module, not_loaded", [
    # the trainer knows the run store, not the dashboard: the run's page comes from the
    # runs folder (posttrain.runs.dashboard_link), never from importing the dashboard
    ("posttrain.train.grpo.trainer", ("posttrain.ui", "posttrain.runs.server")),
    # the environment contract loads no adapter of another library's environments
    ("posttrain.envs.base", ("posttrain.envs.ecosystem",)),
    # a rule loads its own modules and the contract, no registry of every other rule
    ("posttrain.envs.refund.rule", ("posttrain.envs.ecosystem", "posttrain.envs.registry",
                                    "posttrain.envs.refund_multiturn")),
])
def test_a_module_loads_only_what_it_names(module, not_loaded):
    loaded = _posttrain_modules_loaded_by(module)
    assert module in loaded
    assert [name for name in loaded if name.startswith(not_loaded)] == []


@pytest.mark.parametrize("face", ["posttrain", "posttrain.service", "posttrain.service.engine",
                                  "posttrain.envs", "posttrain.envs.ecosystem",
                                  "posttrain.envs.refund", "posttrain.envs.refund_multiturn",
                                  "posttrain.service.client", "posttrain.ui"])
def test_every_lazy_export_resolves(face):
    """Each name a package face exports lazily is defined where its table says."""
    package = importlib.import_module(face)
    assert package._EXPORTS
    for name, module_name in package._EXPORTS.items():
        assert hasattr(importlib.import_module(module_name), name), (name, module_name)
        assert getattr(package, name) is getattr(importlib.import_module(module_name), name)
    assert sorted(package.__all__) == sorted(package._EXPORTS)


def test_every_subcommand_module_and_builtin_environment_resolves():
    """The CLI's ``COMMAND_MODULES`` and ``envs.BUILTIN_ENVS`` are strings: each must name
    what exists (a module with ``register``; an object the environment check accepts)."""
    from posttrain.cli import COMMAND_MODULES
    from posttrain.envs import BUILTIN_ENVS, get_env

    for module_name in COMMAND_MODULES:
        assert callable(importlib.import_module(module_name).register), module_name
    for name, target in BUILTIN_ENVS.items():
        module_name, _, attribute = target.partition(":")
        assert hasattr(importlib.import_module(module_name), attribute), target
        assert get_env(name).name == name


def test_importing_the_service_client_loads_no_server_module():
    """``posttrain.service`` is lazy in fact: importing the client (which runs the
    package's ``__init__`` first) loads no module of the engine, the protocols or the
    server, and few posttrain modules in all (99 before the face was made lazy)."""
    code = ("import sys, json\n"
            "import posttrain.service.client.rl\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('posttrain'))))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    server_side = [name for name in loaded if name.startswith(
        ("posttrain.service.engine", "posttrain.service.protocols", "posttrain.service.server",
         "posttrain.service.demo"))]
    assert server_side == []
    assert len(loaded) <= 40, loaded


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


def _holds_logic(path: Path) -> bool:
    """Whether a module defines a function or a class (a package face that only imports
    and re-exports does not)."""
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for node in ast.parse(path.read_text()).body)


def test_docs_layout_names_every_module():
    # docs/layout.md is the newcomer's map: a module it does not name is a room nobody finds
    text = (ROOT / "docs/layout.md").read_text()
    missing = []
    for path in sorted((ROOT / "posttrain").rglob("*.py")):
        relative = path.relative_to(ROOT / "posttrain").as_posix()
        if path.name == "__init__.py" and relative != "__init__.py" and not _holds_logic(path):
            continue  # a face that only re-exports is its package's row
        # grouped rows name the first module by path and the rest by file name
        if f"`{relative}`" not in text and not (f"`{path.name}`" in text
                                                 or f" {path.name}`" in text):
            missing.append(relative)
    assert missing == []
