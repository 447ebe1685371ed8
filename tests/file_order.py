"""The order the suite's files are dealt to its two workers: the longest first.

``scripts/test.sh`` runs the suite on two pytest-xdist workers, each file whole on one of
them (``--dist loadfile``: a file's module fixtures are built once). xdist deals the files
in the order it is given (``--no-loadscope-reorder``; its own order is by number of tests,
which put the 3-test, 49-second cookbook file last: one worker ran alone for its last
50 seconds). Dealing the longest files first (longest-processing-time first) leaves the
short ones to even out the two workers' ends.

That holds once the fixtures' models are built (``tests/model_cache.py``). In a session
that builds them (a fresh clone, a change to a file a build reads) the longest files all
wait on the starter-2m build, both workers idle together; there the files go as xdist
would order them, the most tests first (light files among them), so one worker builds
while the other tests.

The seconds are each file's, measured with both workers busy on this project's 2-core
machine (``benchmarks/suite_timeline.py`` records and sums them; benchmarks/RESULTS.md,
"The test suite's time"). They only order the files: a
stale figure costs a few seconds, never a result, and a file not named here comes after
these, the files with more tests first (xdist's own order).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: seconds per file (the suite's run of 2026-12-06 on abe3649, models cached), files of 10 s or more
FILE_SECONDS = {
    "tests/test_ecosystem_verifiers.py": 92,
    "tests/test_data_parallel.py": 82,
    "tests/test_tinker_durable.py": 68,
    "tests/test_foreign_servers.py": 63,
    "tests/test_starter.py": 56,
    "tests/test_shared_prefix.py": 54,
    "tests/test_tinker_cookbook.py": 50,
    "tests/test_dashboard.py": 45,
    "tests/test_grpo_e2e.py": 42,
    "tests/test_holdout_set.py": 33,
    "tests/test_ecosystem_inspect.py": 33,
    "tests/test_precision.py": 30,
    "tests/test_openenv.py": 27,
    "tests/test_fuzz.py": 26,
    "tests/test_postgres_store.py": 23,
    "tests/test_grpo_rollout.py": 23,
    "tests/test_run_lifecycle.py": 20,
    "tests/test_settings_route.py": 18,
    "tests/test_example_env.py": 18,
    "tests/test_multiturn_e2e.py": 17,
    "tests/test_eval_logs.py": 17,
    "tests/test_signal_watch.py": 16,
    "tests/test_service_api.py": 14,
    "tests/test_run_server.py": 12,
    "tests/test_env_starter.py": 11,
    "tests/test_pick_tokens.py": 10,
    "tests/test_dpo.py": 10,
}


def file_of(item: Any) -> str:
    """The test's file as the suite names it (``tests/test_x.py``)."""
    return item.nodeid.split("::", 1)[0]


def order_files(items: list[Any], *, models_built: bool) -> None:
    """Reorder ``items`` in place, whole files: the longest (``FILE_SECONDS``) first when
    ``models_built``, then (or else only) the files with more tests first; a file's own
    tests keep their order."""
    tests_in = Counter(file_of(item) for item in items)
    first_seen = {name: index for index, name in enumerate(dict.fromkeys(map(file_of, items)))}

    def rank(item: Any) -> tuple[int, int, int]:
        name = file_of(item)
        seconds = FILE_SECONDS.get(name, 0) if models_built else 0
        return -seconds, -tests_in[name], first_seen[name]

    items.sort(key=rank)  # stable: a file's tests stay in their order
