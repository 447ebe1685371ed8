"""The suite's files are dealt longest first (tests/file_order.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.file_order import FILE_SECONDS, order_files

ROOT = Path(__file__).resolve().parent.parent


def items(*nodeids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


COLLECTED = ("tests/test_a.py::one", "tests/test_shared_prefix.py::x", "tests/test_b.py::one",
             "tests/test_b.py::two", "tests/test_data_parallel.py::y",
             "tests/test_shared_prefix.py::z")


def test_the_longest_files_come_first_whole_and_in_their_own_order():
    collected = items(*COLLECTED)
    order_files(collected)
    assert [item.nodeid for item in collected] == [
        "tests/test_data_parallel.py::y",  # 125 s
        "tests/test_shared_prefix.py::x", "tests/test_shared_prefix.py::z",  # 94 s
        "tests/test_b.py::one", "tests/test_b.py::two",  # unmeasured: more tests first
        "tests/test_a.py::one",
    ]


def test_every_file_named_exists():
    # a renamed file would silently lose its place at the front
    assert [name for name in FILE_SECONDS if not (ROOT / name).is_file()] == []


def test_the_timeline_plugin_records_each_test_and_sums_its_file(tmp_path):
    """benchmarks/suite_timeline.py, the plugin behind FILE_SECONDS, on a real pytest run."""
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTEST_XDIST_WORKER"}  # a run of its own: one timeline, main's
    environment.update(PYTHONPATH=str(ROOT / "benchmarks"), SUITE_TIMELINE=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_timeline",
         "tests/test_file_order.py::test_every_file_named_exists",
         "tests/test_file_order.py::test_the_longest_files_come_first_whole_and_in_their_own_order"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((tmp_path / "main.txt").read_text().splitlines()) == 2
    cpu_lines = (tmp_path / "main.cpu").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in cpu_lines] == [
        "tests/test_file_order.py::test_every_file_named_exists",
        "tests/test_file_order.py::test_the_longest_files_come_first_whole_and_in_their_own_order"]
    assert all(float(line.split(" ", 1)[0]) >= 0 for line in cpu_lines)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from suite_timeline import summarize
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    summary = summarize(tmp_path).splitlines()
    assert summary[0].startswith("main: span ") and summary[0].endswith(", 2 tests")
    assert summary[1].endswith("s  tests/test_file_order.py")
    assert summary[2].startswith("CPU seconds of the tests: ")
    assert summary[3].endswith("s CPU  tests/test_file_order.py")
