#!/usr/bin/env bash
# The test suite, from a fresh clone: creates .venv if needed, then runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k simulate).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/venv.sh test
bash scripts/chromium.sh
# compiled modules are kept (__pycache__, git-ignored) even where the shell asks Python not
# to write them: every worker's collection rewrites and compiles ~90 test files otherwise
# (measured: collection 20 s -> 15 s a worker), and every process the tests start compiles
# the package again
unset PYTHONDONTWRITEBYTECODE
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Three worker processes (pytest-xdist), each test file on one of them (its module fixtures
# built once), each worker's torch on one thread that sleeps rather than spins when it
# waits: on 2 cores two 2-thread OpenMP teams stall each other at every barrier (measured:
# the suite in 14.9 min in one process, 11.1 min in two like this). Three, not one a core:
# many tests wait on a process or server they started, and two workers left the cores
# idle 13% of the time; the third fills it (measured back to back: 655 s with two
# workers, 531 s with three; benchmarks/RESULTS.md, "The test suite's time").
# A starter build still runs on its own fixed 2 threads (the same weights everywhere).
# The files are dealt in the order the suite collects them (--no-loadscope-reorder): the
# longest first (tests/file_order.py).
# POSTTRAIN_TEST_WORKERS=N runs N workers, 0 the suite in one process.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# The suite computes as every x86-64 CPU with AVX2 does: posttrain.cpu_numerics' pinned
# kernels, for the test processes and every command they start (the same values a command
# sets for the embedded starters), so a test's numbers are the same here, on an AVX2-only
# laptop and in CI. POSTTRAIN_NUMERICS=native runs it on this CPU's own kernels instead
# (the kept test models follow the setting).
if [ "${POSTTRAIN_NUMERICS:-auto}" != native ]; then
  export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2
fi
workers="${POSTTRAIN_TEST_WORKERS:-3}"
if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
  echo "scripts/test.sh: POSTTRAIN_TEST_WORKERS must be a whole number of workers (0: the" \
       "suite in one process), got '$workers'" >&2
  exit 2
fi
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
