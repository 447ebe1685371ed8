#!/usr/bin/env bash
# One GPU check, minutes not an hour: the default GRPO recipe on a real small model, once
# with transformers generation and once with vLLM (training generation --use-vllm
# colocated, holdout evaluations --sampler vllm), then one table: step time, generation
# share of the step, generated tokens/s, evaluation time and the verdict of each.
#
#   bash benchmarks/gpu.sh                      # Qwen/Qwen2.5-0.5B-Instruct, 20 steps
#   MODEL=/models/qwen0.5b STEPS=40 bash benchmarks/gpu.sh
#
# Needs a CUDA GPU and network for the first set-up (PyPI, and the Hub unless MODEL is a
# local folder). The GPU environment is its own venv (.venv-gpu): vLLM pins the CUDA torch
# it was built against, which the CPU venv's constraints would refuse.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
steps="${STEPS:-20}"
runs="${RUNS_DIR:-$root/benchmarks/gpu-runs}"
venv="${GPU_VENV:-$root/.venv-gpu}"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "benchmarks/gpu.sh: no CUDA GPU here (nvidia-smi finds none); run it on a GPU machine" >&2
  exit 2
fi
nvidia-smi -L
if [ ! -x "$venv/bin/python" ]; then
  echo "[gpu.sh] creating $venv (vllm and its CUDA torch, then posttrain; a few minutes)" >&2
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install vllm
  # posttrain's pins, but the torch vLLM brought stays
  grep -v '^torch==' constraints.txt > "$venv/constraints-gpu.txt"
  "${pip[@]}" install -c "$venv/constraints-gpu.txt" -e ".[train]"
fi
py="$venv/bin/python"
"$py" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch sees no GPU'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"

common=(--base-model "$model" --steps "$steps" --runs-dir "$runs" --overwrite)
"$py" -m posttrain grpo "${common[@]}" --run-name gpu-transformers || true   # exit 1 = not moved
"$py" -m posttrain grpo "${common[@]}" --run-name gpu-vllm --use-vllm --vllm-mode colocate \
  --sampler vllm || true
"$py" benchmarks/gpu_summary.py "$runs" gpu-transformers gpu-vllm
