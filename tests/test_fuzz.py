"""Property-based fuzzing (Hypothesis) of every place input enters: prompt and pair files,
the run store's ingest ops (in SQLite and over HTTP), the dashboard's query parameters,
the service's request bodies, the strict JSON reader, every numeric flag of every
command and --config files. Any input gives a result or a clear, named error, never a
traceback or a 500, and nothing already stored changes (see tests/fuzzing.py).

CI runs each target on a few hundred inputs (under a minute together);
`python benchmarks/fuzz.py` runs them on many more.
"""

from __future__ import annotations

import pytest
from fuzzing import TARGETS, run_target

# inputs per target in CI: together well under a minute on a busy 2-core machine
CI_EXAMPLES = {
    "cli_flags": 400,
    "dashboard_queries": 300,
    "settings_files": 300,
    "prompt_file": 300,
    "pairs_file": 300,
    "ingest_ops": 300,
    "ingest_http": 150,
    "service_bodies": 600,
    "strict_json": 600,
}


def test_every_target_has_a_ci_budget():
    assert set(CI_EXAMPLES) == set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_holds_its_contract(name):
    result = run_target(name, CI_EXAMPLES[name])
    # Hypothesis stops early only when it has tried every input its strategy can make
    assert result.examples >= min(100, CI_EXAMPLES[name]), result
    print(f"{name}: {result.examples} inputs ({result.accepted} accepted) in "
          f"{result.seconds:.1f} s")
