#!/usr/bin/env bash
# The test suite, from a fresh clone: creates .venv if needed, then runs pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k simulate).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/venv.sh
bash scripts/chromium.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q "$@"
