#!/usr/bin/env bash
# tools/serve under load (tools/bench/serve_load, a separate process over
# loopback HTTP): requests/s, output tokens/s, p50/p99 time to first token and
# inter-token latency at 1, 8, 32 and 64 concurrent clients, for the same
# model served several ways in one run: continuous batching tuned for latency
# and for throughput, --max-batch-size 1 (no batching) and static batching,
# and continuous batching again with weight-only int8 (--quantize int8, the
# decoding tokens/s change). Prints a markdown table and the goals (at 32
# clients: >= 4x the tokens/s of --max-batch-size 1, p99 inter-token latency
# < 3x the single-client one).
#   tools/bazel run //tools/bench:serve [-- SECONDS_PER_POINT]
set -euo pipefail
train=$1
serve=$2
load=$3
seconds=${4:-10}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
model=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 512
       --num-attention-heads 8 --seq-length 256)
"$train" "${model[@]}" --micro-batch-size 1 --train-iters 1 --num-threads 1 \
  --save "$work/ckpt" > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }

echo "| server | clients | requests/s | output tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
echo "|---|---|---|---|---|---|---|---|"
# "continuous" is tuned for inter-token latency (at most 12 sequences and 16
# tokens a step, so a step that takes a prefill chunk is barely longer than a
# decoding one); "continuous64" for throughput (64 sequences, the default
# budget of chunk + batch size).
for config in "continuous --max-batch-size 12 --max-tokens-per-step 16" \
              "continuous64 --max-batch-size 64" "batch1 --max-batch-size 1" \
              "static --max-batch-size 64 --batching static" \
              "int8 --max-batch-size 12 --max-tokens-per-step 16 --quantize int8"; do
  read -r name flags <<< "$config"
  rm -f "$work/port"
  # shellcheck disable=SC2086
  "$serve" --load "$work/ckpt" --port 0 --port-file "$work/port" \
    --prefill-chunk-size 16 --kv-cache-bytes 1000000000 $flags \
    > "$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -s "$work/port" ]] && break; sleep 0.1; done
  [[ -s "$work/port" ]] || { cat "$work/$name.log"; exit 1; }
  port=$(cat "$work/port")
  "$load" --port "$port" --concurrency 4 --seconds 2 > /dev/null  # Warm up.
  for clients in 1 8 32 64; do
    line=$("$load" --port "$port" --concurrency "$clients" --seconds "$seconds")
    echo "$name $line" >> "$work/results"
    python3 - "$name" "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
print("| %s | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
    sys.argv[1], r["concurrency"], r["requests_per_s"], r["tokens_per_s"],
    r["ttft_p50_ms"], r["ttft_p99_ms"], r["itl_p50_ms"], r["itl_p99_ms"]))
PY
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
python3 - "$work/results" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    name, payload = line.split(" ", 1)
    r = json.loads(payload)
    rows[(name, r["concurrency"])] = r
c32, b32 = rows[("continuous", 32)], rows[("batch1", 32)]
c1 = rows[("continuous", 1)]
speedup = c32["tokens_per_s"] / max(b32["tokens_per_s"], 1e-9)
itl = c32["itl_p99_ms"] / max(c1["itl_p99_ms"], 1e-9)
print()
print("at 32 clients: continuous batching %.2fx the output tokens/s of "
      "--max-batch-size 1 (goal >= 4x): %s" % (speedup, "met" if speedup >= 4 else "NOT met"))
print("at 32 clients: p99 inter-token latency %.2fx the single-client p99 "
      "(goal < 3x): %s" % (itl, "met" if itl < 3 else "NOT met"))
t32 = rows[("continuous64", 32)]
print("at 32 clients, tuned for throughput (--max-batch-size 64): %.2fx the "
      "output tokens/s of --max-batch-size 1, p99 inter-token latency %.2fx "
      "the single-client p99" % (
          t32["tokens_per_s"] / max(b32["tokens_per_s"], 1e-9),
          t32["itl_p99_ms"] / max(c1["itl_p99_ms"], 1e-9)))
for n in (1, 32):
    i8, f32 = rows[("int8", n)], rows[("continuous", n)]
    print("at %d client(s): int8 weights %.2fx the output tokens/s of fp32 "
          "weights (p50 inter-token latency %.1f ms against %.1f ms)" % (
              n, i8["tokens_per_s"] / max(f32["tokens_per_s"], 1e-9),
              i8["itl_p50_ms"], f32["itl_p50_ms"]))
PY
