#!/usr/bin/env bash
# What tools/serve's guards cost: output tokens/s of the same server and
# model with the guards on (--api-key, --max-queued-requests,
# --request-timeout, --max-prompt-tokens, --max-connections) and off (no key,
# no queue bound, no timeout), and optionally a reference serve binary built
# before them (plain httplib), in interleaved rounds so that the load of a
# shared machine falls on every configuration alike. Prints each round and
# the median ratio.
#   tools/bazel run //tools/bench:serve_guards [-- SECONDS ROUNDS CLIENTS [REFERENCE_SERVE]]
set -euo pipefail
train=$1
serve=$2
load=$3
seconds=${4:-10}
rounds=${5:-3}
clients=${6:-16}
reference=${7:-}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
model=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 512
       --num-attention-heads 8 --seq-length 256)
"$train" "${model[@]}" --micro-batch-size 1 --train-iters 1 --num-threads 1 \
  --save "$work/ckpt" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
common=(--load "$work/ckpt" --port 0 --prefill-chunk-size 16
        --kv-cache-bytes 1000000000 --max-batch-size 12 --max-tokens-per-step 16)
guards=(--api-key bench-key --max-queued-requests 64 --request-timeout 600
        --max-prompt-tokens 128 --max-connections 256)
off=(--max-queued-requests 0 --request-timeout 0)
configs=(off guarded)
[[ -n $reference ]] && configs+=(reference)

run_one() {  # run_one NAME: prints output tokens/s
  local name=$1 bin=$serve key=""
  local flags=("${common[@]}")
  case $name in
    off) flags+=("${off[@]}") ;;
    guarded) flags+=("${guards[@]}"); key=bench-key ;;
    reference) bin=$reference ;;
  esac
  rm -f "$work/port"
  "$bin" "${flags[@]}" --port-file "$work/port" > "$work/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do [[ -s "$work/port" ]] && break; sleep 0.1; done
  [[ -s "$work/port" ]] || { cat "$work/$name.log" >&2; exit 1; }
  local port
  port=$(cat "$work/port")
  "$load" --port "$port" --api_key "$key" --concurrency 4 --seconds 2 > /dev/null
  local line
  line=$("$load" --port "$port" --api_key "$key" --concurrency "$clients" \
    --seconds "$seconds")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["errors"]==0, r; print(r["tokens_per_s"])' "$line"
}

echo "| round | ${configs[*]} |"
for r in $(seq "$rounds"); do
  row="| $r"
  # Every other round in reverse order, so that a drifting machine load
  # falls on each configuration alike.
  order=("${configs[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[$i]}"); done
  fi
  for c in "${order[@]}"; do
    t=$(run_one "$c")
    echo "$r $c $t" >> "$work/results"
  done
  for c in "${configs[@]}"; do
    row="$row | $(awk -v r="$r" -v c="$c" '$1 == r && $2 == c {print $3}' "$work/results")"
  done
  echo "$row |"
done
python3 - "$work/results" <<'PY'
import collections, statistics, sys
by = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, c, t = line.split()
    by[int(r)][c] = float(t)
for other in ("off", "reference"):
    ratios = [v["guarded"] / v[other] for v in by.values() if other in v]
    if ratios:
        print("guarded / %s output tokens/s: median %.4f (rounds: %s)" % (
            other, statistics.median(ratios), ", ".join("%.4f" % x for x in ratios)))
PY
