"""The suite's files are dealt longest first (tests/file_order.py)."""

from __future__ import annotations

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
    order_files(collected, models_built=True)
    assert [item.nodeid for item in collected] == [
        "tests/test_data_parallel.py::y",  # 95 s
        "tests/test_shared_prefix.py::x", "tests/test_shared_prefix.py::z",  # 71 s
        "tests/test_b.py::one", "tests/test_b.py::two",  # unmeasured: more tests first
        "tests/test_a.py::one",
    ]


def test_before_the_models_are_built_the_files_with_more_tests_go_first():
    collected = items(*COLLECTED)
    order_files(collected, models_built=False)
    assert [item.nodeid for item in collected] == [
        "tests/test_shared_prefix.py::x", "tests/test_shared_prefix.py::z",
        "tests/test_b.py::one", "tests/test_b.py::two",
        "tests/test_a.py::one", "tests/test_data_parallel.py::y",
    ]


def test_every_file_named_exists():
    # a renamed file would silently lose its place at the front
    assert [name for name in FILE_SECONDS if not (ROOT / name).is_file()] == []
