#!/usr/bin/env bash
# End to end, in real processes, with real clients: tools/train makes small
# checkpoints (TP 1 and TP 2) on mock data; tools/serve serves them, and
#  - curl checks both APIs, streaming and errors by hand;
#  - serve_client_test.py (Python's standard library only) checks every field
#    of both APIs, streaming, every bad request, a client leaving mid-stream
#    and 64 concurrent requests against the same requests one at a time;
#  - the server under TP 2, PP 2 and TP 2 x PP 2 (the TP 2 checkpoint
#    resharded) answers greedy requests as TP 1 PP 1 does;
#  - killing a rank stops the job with an error, without a hang;
#  - max_tokens overflow is a 400, a second serve on a port in use exits
#    non-zero naming it, and an API key is asked for and never logged.
set -euo pipefail
launch=$1
train=$2
serve=$3
client=$4
python=/usr/bin/python3
[[ -x $python ]] || python=python3
work=${TEST_TMPDIR:-$(mktemp -d)}
model=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
       --num-attention-heads 4 --seq-length 64 --num-threads 1)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

fail() { echo "FAILED: $*"; exit 1; }
run() {  # run LOG CMD...: runs CMD, showing LOG when it fails.
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { echo "FAILED ($?): $*"; cat "$log"; exit 1; }
}

run "$work/train.log" "$train" "${model[@]}" --micro-batch-size 2 \
  --train-iters 6 --save "$work/ckpt"
run "$work/train_tp2.log" "$launch" --nproc_per_node 2 -- "$train" \
  "${model[@]}" --micro-batch-size 2 --train-iters 6 \
  --tensor-model-parallel-size 2 --save "$work/ckpt_tp2"

# start NAME NPROC FLAGS...: a server on a free port (bound to port 0, the
# port read back from --port-file), in the background; sets $port and $pid.
start() {
  local name=$1 nproc=$2
  shift 2
  rm -f "$work/$name.port"
  if [[ $nproc == 1 ]]; then
    "$serve" --port 0 --port-file "$work/$name.port" --num-threads 1 "$@" \
      > "$work/$name.log" 2>&1 &
  else
    "$launch" --nproc_per_node "$nproc" -- "$serve" --port 0 \
      --port-file "$work/$name.port" --num-threads 1 "$@" \
      > "$work/$name.log" 2>&1 &
  fi
  pid=$!
  pids+=("$pid")
  for _ in $(seq 600); do
    [[ -s "$work/$name.port" ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.log"; fail "$name exited"; }
    sleep 0.2
  done
  [[ -s "$work/$name.port" ]] || { cat "$work/$name.log"; fail "$name never listened"; }
  port=$(cat "$work/$name.port")
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# --- One process: curl, then the Python client. ---
start tp1 1 --load "$work/ckpt" --max-body-bytes 4096 --max-batch-size 16 \
  --prefill-chunk-size 8 --kv-cache-bytes 8000000
url=http://127.0.0.1:$port
[[ $(curl -s "$url/health") == '{"status":"ok"}' ]] || fail "curl /health"
out=$(curl -s -X PUT "$url/api" -H 'Content-Type: application/json' \
  -d '{"prompts": ["Hello"], "tokens_to_generate": 4, "top_k": 1, "logprobs": true}')
for key in '"text":\["Hello' '"segments":\[\["H","e"' '"logprobs":\[\[' '"tokens":\[\[72,101'; do
  grep -q "$key" <<< "$out" || fail "curl PUT /api lacks $key: $out"
done
out=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 4, "temperature": 0}')
grep -q '"object":"text_completion"' <<< "$out" || fail "curl completions: $out"
out=$(curl -sN "$url/v1/completions" \
  -d '{"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": true}')
[[ $(grep -c '^data: {' <<< "$out") == 5 ]] || fail "curl stream events: $out"
[[ $(grep -v '^$' <<< "$out" | tail -1) == "data: [DONE]" ]] || fail "curl stream end: $out"
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/v1/completions" -d '{"prompt":')
[[ $code == 400 ]] && grep -q "not valid JSON" "$work/err.json" || fail "curl bad JSON: $code"
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/nowhere")
[[ $code == 404 ]] && grep -q "no endpoint" "$work/err.json" || fail "curl 404: $code"
curl -s "$url/metrics" | grep -q '^serve_requests_total [1-9]' || fail "curl /metrics"
run "$work/client.log" "$python" "$client" "$port" --max-body-bytes 4096
grep -q "all client checks passed" "$work/client.log" || fail "client: $(cat "$work/client.log")"
"$python" "$client" "$port" --only greedy > "$work/greedy_tp1.json"
# max_tokens of INT64_MAX once overflowed the length check and stopped serve.
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/v1/completions" \
  -d '{"prompt": "Hi", "max_tokens": 9223372036854775807}')
[[ $code == 400 ]] && grep -q "context of" "$work/err.json" || fail "max_tokens overflow: $code $(cat "$work/err.json")"
[[ $(curl -s "$url/health") == '{"status":"ok"}' ]] || fail "/health after max_tokens overflow"
# A second server on the port in use exits non-zero, naming the port (it
# once bound it too, through SO_REUSEPORT, and served: timeout's 124).
busy=$port
if timeout 120 "$serve" --load "$work/ckpt" --port "$busy" --num-threads 1 > "$work/busy.log" 2>&1; then
  fail "a second serve on port $busy exited 0"
fi
grep -q -- "--port $busy" "$work/busy.log" || fail "no error names port $busy: $(cat "$work/busy.log")"
[[ $(curl -s "$url/health") == '{"status":"ok"}' ]] || fail "/health after the second serve"
stop "$pid"

# --- An API key (from MCC_API_KEY): 401 without it, 200 with it, /health
# open, and the key never in the log. ---
MCC_API_KEY=e2e-secret-key start keyed 1 --load "$work/ckpt"
url=http://127.0.0.1:$port
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/v1/completions" -d '{"prompt": "Hi", "max_tokens": 2}')
[[ $code == 401 ]] || fail "no key: $code $(cat "$work/err.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer e2e-secret-key' \
  "$url/v1/completions" -d '{"prompt": "Hi", "max_tokens": 2}')
[[ $code == 200 ]] || fail "with the key: $code"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] || fail "/health needs no key"
stop "$pid"
grep -q "e2e-secret-key" "$work/keyed.log" && fail "the API key is in the log"

# --- Layouts: the same greedy answers (tokens exact, log-probabilities to
# fp32 reduction-order error). ---
same_greedy() {  # same_greedy ANSWER [REFERENCE (greedy_tp1.json)]
  "$python" - "${2:-$work/greedy_tp1.json}" "$1" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] and a["text"] == b["text"], (a, b)
for x, y in zip(a["logprobs"], b["logprobs"]):
    assert len(x) == len(y) and all(abs(u - v) < 2e-4 for u, v in zip(x, y)), (x, y)
PY
}
for layout in "tp2 2 ckpt --tensor-model-parallel-size 2" \
              "pp2 2 ckpt_tp2 --pipeline-model-parallel-size 2" \
              "tp2pp2 4 ckpt_tp2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"; do
  read -r name nproc dir flags <<< "$layout"
  # shellcheck disable=SC2086
  start "$name" "$nproc" --load "$work/$dir" $flags
  "$python" "$client" "$port" --only greedy > "$work/greedy_$name.json" \
    || { cat "$work/$name.log"; fail "$name: no greedy answer"; }
  same_greedy "$work/greedy_$name.json" || fail "$name answers differently"
  if [[ $name == tp2 ]]; then
    # A rank's death stops the job with an error, within a minute.
    victim=""
    for child in $(pgrep -P "$pid"); do
      # grep reads the file itself: under pipefail a tr feeding "grep -q"
      # can die of SIGPIPE once grep has matched (a long environment).
      grep -qsxz "RANK=1" "/proc/$child/environ" && victim=$child
    done
    [[ -n $victim ]] || fail "no rank 1 under the launcher"
    kill -9 "$victim"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && fail "the job still runs a minute after rank 1 died"
    if wait "$pid"; then fail "the job exited 0 after rank 1 died"; fi
    grep -qi "rank 1" "$work/$name.log" || fail "no error names rank 1: $(cat "$work/$name.log")"
  else
    stop "$pid"
  fi
done
# --- Weight-only int8 (--quantize int8): the engine computes with int8
# weights; TP 2 answers as TP 1 does (the scales are per global row). ---
start int8 1 --load "$work/ckpt" --quantize int8
grep -q "int8" "$work/int8.log" || fail "no int8 weights logged: $(cat "$work/int8.log")"
"$python" "$client" "$port" --only greedy > "$work/greedy_int8.json" \
  || { cat "$work/int8.log"; fail "int8: no greedy answer"; }
stop "$pid"
start int8tp2 2 --load "$work/ckpt" --quantize int8 --tensor-model-parallel-size 2
"$python" "$client" "$port" --only greedy > "$work/greedy_int8tp2.json" \
  || { cat "$work/int8tp2.log"; fail "int8 TP 2: no greedy answer"; }
same_greedy "$work/greedy_int8tp2.json" "$work/greedy_int8.json" \
  || fail "int8 TP 2 answers differently from int8 TP 1"
stop "$pid"
echo "PASSED"
