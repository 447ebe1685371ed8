"""The order the suite's files are dealt to its workers: the longest first.

``scripts/test.sh`` runs the suite on three pytest-xdist workers, each file whole on one of
them (``--dist loadfile``: a file's module fixtures are built once). xdist deals the files
in the order it is given (``--no-loadscope-reorder``; its own order is by number of tests,
which put the 3-test, 49-second cookbook file last: one worker ran alone for its last
50 seconds). Dealing the longest files first (longest-processing-time first) leaves the
short ones to even out the workers' ends.

The same order serves a session that builds the test models (a fresh clone, a change to a
file a build reads; ``tests/model_cache.py``): a build runs in a process of its own on two
threads, so the workers that wait on it leave the cores to it, and the long files that
need a model are dealt early, not left for the end (measured with every model built: the
three workers ended within 1 s, against 55 s apart when such sessions dealt the files with
more tests first; benchmarks/RESULTS.md, "The test suite's time").

The seconds are each file's, measured with every worker busy on this project's 2-core
machine (``benchmarks/suite_timeline.py`` records and sums them). They only order the
files: a stale figure costs a few seconds, never a result, and a file not named here
comes after these, the files with more tests first (xdist's own order).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: seconds per file (the suite's run of 2026-12-07 on 4fd0f28's successors, three workers,
#: the library example's starter rebuilt as in a fresh clone; test_grpo_errors.py after its
#: kill test was shortened), files of 10 s or more
FILE_SECONDS = {
    "tests/test_example_env.py": 194,
    "tests/test_tinker_durable.py": 123,
    "tests/test_ecosystem_verifiers.py": 108,
    "tests/test_data_parallel.py": 89,
    "tests/test_shared_prefix.py": 86,
    "tests/test_tinker_cookbook.py": 74,
    "tests/test_foreign_servers.py": 68,
    "tests/test_starter.py": 56,
    "tests/test_openenv.py": 51,
    "tests/test_grpo_e2e.py": 50,
    "tests/test_dashboard.py": 47,
    "tests/test_grpo_errors.py": 45,
    "tests/test_ecosystem_inspect.py": 37,
    "tests/test_holdout_set.py": 33,
    "tests/test_fuzz.py": 32,
    "tests/test_postgres_store.py": 30,
    "tests/test_eval_logs.py": 30,
    "tests/test_grpo_rollout.py": 29,
    "tests/test_precision.py": 25,
    "tests/test_multiturn_e2e.py": 23,
    "tests/test_run_lifecycle.py": 23,
    "tests/test_settings_route.py": 21,
    "tests/test_service_api.py": 21,
    "tests/test_signal_watch.py": 20,
    "tests/test_cpu_numerics.py": 19,
    "tests/test_sft.py": 17,
    "tests/test_pick_tokens.py": 15,
    "tests/test_tinker_sdk.py": 15,
    "tests/test_judge.py": 14,
    "tests/test_cold_start.py": 45,
    "tests/test_cold_start_hint.py": 22,
}


def file_of(item: Any) -> str:
    """The test's file as the suite names it (``tests/test_x.py``)."""
    return item.nodeid.split("::", 1)[0]


def order_files(items: list[Any]) -> None:
    """Reorder ``items`` in place, whole files: the longest (``FILE_SECONDS``) first, then
    the files with more tests first; a file's own tests keep their order."""
    tests_in = Counter(file_of(item) for item in items)
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(map(file_of, items)))}

    def rank(item: Any) -> tuple[int, int, int]:
        name = file_of(item)
        return -FILE_SECONDS.get(name, 0), -tests_in[name], first_seen[name]

    items.sort(key=rank)  # stable: a file's tests stay in their order
