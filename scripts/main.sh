#!/usr/bin/env bash
# The main job, from a fresh clone: creates .venv if needed, then runs it.
# Extra arguments go to the command (e.g. scripts/main.sh --samples 8).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/venv.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/posttrain eval --agent seeded "$@"
