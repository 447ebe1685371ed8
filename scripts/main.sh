#!/usr/bin/env bash
# The main job, from a fresh clone: creates .venv if needed, then runs the GRPO
# recipe on the embedded starter model (built on first use, a few minutes) and
# prints its before/after report. The run lands in runs/main-grpo/ (replaced on
# each run). Extra arguments go to `posttrain grpo` (e.g. scripts/main.sh --steps 20).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/venv.sh main
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/posttrain grpo --run-name main-grpo --overwrite "$@"
