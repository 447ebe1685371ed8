"""The test sessions' reused models folder (tests/model_cache.py): its name changes with
anything a build reads, and only then."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.model_cache import REPO, SOURCE_TREES, build_inputs_digest, cache_folder


def copy_of_the_sources(folder: Path) -> Path:
    for tree in SOURCE_TREES:
        shutil.copytree(REPO / tree, folder / tree,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return folder


def test_the_digest_changes_with_any_file_a_build_can_read_and_nothing_else(tmp_path):
    repo = copy_of_the_sources(tmp_path / "repo")
    digest = build_inputs_digest(repo)
    assert digest == build_inputs_digest(repo)  # the same tree, the same name
    # what Python writes beside the sources, and the tests, are not build inputs
    (repo / "posttrain" / "__pycache__").mkdir(exist_ok=True)
    (repo / "posttrain" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_new.py").write_text("def test(): pass\n")
    assert build_inputs_digest(repo) == digest
    # one byte of the package, of an example, or a file added or renamed: another name
    changes = []
    starter_data = repo / "posttrain" / "envs" / "refund" / "starter_data.py"
    starter_data.write_text(starter_data.read_text() + "\n")
    changes.append(build_inputs_digest(repo))
    example = repo / "examples" / "library_env.py"
    example.write_text(example.read_text().replace("library", "Library", 1))
    changes.append(build_inputs_digest(repo))
    (repo / "examples" / "prompts.jsonl").write_text("{}\n")
    changes.append(build_inputs_digest(repo))
    (repo / "examples" / "prompts.jsonl").rename(repo / "examples" / "other.jsonl")
    changes.append(build_inputs_digest(repo))
    assert len({digest, *changes}) == 5


def test_a_new_set_removes_the_older_ones_and_an_existing_one_is_kept(tmp_path):
    root = tmp_path / "posttrain-test-models"
    first = cache_folder(root, "aaaa")
    (first / "starter").mkdir()
    assert cache_folder(root, "aaaa") == first and (first / "starter").is_dir()
    second = cache_folder(root, "bbbb")
    assert second.is_dir() and not first.exists()
    assert [path.name for path in root.iterdir()] == ["bbbb"]
