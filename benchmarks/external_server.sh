#!/usr/bin/env bash
# `posttrain eval --endpoint` against a server nobody on this project wrote: Hugging Face's
# `transformers serve` (the OpenAI-compatible server that ships with transformers), serving
# starter-2m from a local folder, offline. The same holdout is evaluated with the model
# loaded in-process and the two row files are paired with `posttrain eval --compare`.
#
#     bash benchmarks/external_server.sh            # prints the results
#     bash benchmarks/external_server.sh --write    # and records them in benchmarks/RESULTS.md
#
# transformers serve needs FastAPI, which posttrain does not: it is installed into .venv
# here, pinned (fastapi 0.165.0 takes the starlette 1.10.0 the ui extra pins).
#
# transformers serve copies a request's temperature into the model's generation config but
# samples only when that config says do_sample, which starter-2m's does not, and then keeps
# transformers' default top_k of 50, which posttrain's sampler does not apply. Pass 1 serves
# the folder as it is (greedy, whatever the request says) and pairs it with a greedy
# in-process evaluation; pass 2 serves a copy whose generation_config.json says do_sample
# and top_k 0 (off), paired with the default sampled evaluation (temperature 0.8, top-p 0.95).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh >/dev/null
PY=.venv/bin/python
.venv/bin/pip install -q fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 -c constraints.txt
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/posttrain model build --name starter-2m >/dev/null
FOLDER=$(.venv/bin/posttrain model info starter-2m | awk '/^  folder:/ {print $2}')
PORT=${PORT:-8731}
WORK=$(mktemp -d /tmp/posttrain-external-XXXX)
SERVER=
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT

SAMPLING="$WORK/starter-2m-sampling"
cp -r "$FOLDER" "$SAMPLING"
$PY -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['do_sample'] = True; c['top_k'] = 0; \
json.dump(c, open(p, 'w'), indent=2)" "$SAMPLING/generation_config.json"

serve() {  # serve MODEL_FOLDER PASS in the background and wait for /health
  .venv/bin/transformers serve "$1" --host 127.0.0.1 --port "$PORT" --device cpu \
    --dtype float32 >"$WORK/server-$2.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/server-$2.log"; exit 1; }
    sleep 1
  done
  echo "transformers serve did not come up"; exit 1
}

timed() {  # NAME COMMAND...: run it, stdout to NAME.txt, stderr to NAME.err, seconds to NAME.s
  local name=$1 start
  shift
  start=$(date +%s)
  "$@" >"$WORK/$name.txt" 2>"$WORK/$name.err"
  echo $(( $(date +%s) - start )) >"$WORK/$name.s"
}

for pass in greedy sampling; do
  model=$FOLDER
  [ "$pass" = sampling ] && model=$SAMPLING
  serve "$model" "$pass"
  timed "endpoint-$pass" .venv/bin/posttrain eval --endpoint "http://127.0.0.1:$PORT/v1" \
    --endpoint-model "$model" --out "$WORK/endpoint-$pass.jsonl"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  temperature=()
  [ "$pass" = greedy ] && temperature=(--temperature 0)
  timed "inprocess-$pass" .venv/bin/posttrain eval --base-model starter-2m "${temperature[@]}" \
    --out "$WORK/inprocess-$pass.jsonl"
  .venv/bin/posttrain eval --compare "$WORK/inprocess-$pass.jsonl" \
    "$WORK/endpoint-$pass.jsonl" >"$WORK/compare-$pass.txt" 2>&1 || true
done

VERSION=$($PY -c "import transformers; print(transformers.__version__)")
$PY benchmarks/external_server_summary.py "$WORK" "$VERSION" ${1:+"$1"}
