#!/usr/bin/env bash
# serve on one GPU against transformers' generate (issue 43): serve
# --random-weights makes a Llama-3-8B-shaped model (32 layers, hidden 4096,
# 32 heads over 8 KV groups, FFN 14336, vocabulary 128256, bf16) on the GPU
# itself (16 GB of weights cannot travel), tools/gpu/serve_load.py measures
# output tokens/s, time to first token and p99 inter-token latency at 1, 16
# and 64 concurrent streaming clients, and tools/gpu/hf_llama_peer.py
# generates with the same shape in the machine's PyTorch at batch 1 and 64.
# Prints every figure, the goals (64 clients: 3x the peer's batch-64
# tokens/s, p99 inter-token latency under 30 ms; reported, not enforced),
# then one summary line:
#   SERVE 8B: ok (64 clients: 5000 tokens/s, p99 inter-token 14.2 ms; peer batch 64: 1200 tokens/s; ratio 4.17)
#   SERVE 8B: skipped (no CUDA device)
#   SERVE 8B: FAILED (...)
#
#   tools/gpu/check_serve.sh [DIR]
#
# DIR is a bundle (check_lib.sh's bundle_paths; serve is DIR/bin/tools/serve/serve).
# Environment: SERVE_BIN (the serve binary), SERVE_DEVICE (cuda; the
# rehearsal uses test with //tools/serve:serve_testdev), SERVE_MODEL_FLAGS
# (the 8B shape), SERVE_FLAGS (extra serve flags; default --max-batch-size 64
# --kv-cache-memory-fraction 0.8 --cuda-graph), SERVE_CLIENTS ("1 16 64"),
# SERVE_REQUESTS (per client, 2), SERVE_MAX_TOKENS (128),
# SERVE_PROMPT_CHARS (128: byte tokens, the peer's prompt is 32 ids), SERVE_PEER_ARGS
# (extra peer flags: its shape for a rehearsal), GPU_CHECK_PYTHON (the
# peer's python, default /opt/torch/.venv/bin/python3), SERVE_BUDGET
# (seconds for all, default 240; GPU_CHECK_DEADLINE cuts it).
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"
scripts="$(cd "$(dirname "$0")" && pwd)"

bundle_paths "${1:-gpu_bundle}"
serve="${SERVE_BIN:-${bin}/tools/serve/serve}"
device="${SERVE_DEVICE:-cuda}"
read -r -a model <<<"${SERVE_MODEL_FLAGS:---num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --vocab-size 128256 --seq-length 4096 --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --make-vocab-size-divisible-by 128}"
read -r -a extra <<<"${SERVE_FLAGS:---max-batch-size 64 --kv-cache-memory-fraction 0.8 --cuda-graph}"
clients="${SERVE_CLIENTS:-1 16 64}"
budget="${SERVE_BUDGET:-240}"
deadline=$(($(date +%s) + budget))
if [[ -n "${GPU_CHECK_DEADLINE:-}" ]] && ((GPU_CHECK_DEADLINE < deadline)); then
  deadline=${GPU_CHECK_DEADLINE}
fi
python="${GPU_CHECK_PYTHON:-/opt/torch/.venv/bin/python3}"
[[ -x "${python}" ]] || python="$(command -v python3)"
work="$(mktemp -d)"
pid=""
cleanup() { [[ -n "${pid}" ]] && kill "${pid}" 2>/dev/null; rm -rf "${work}"; }
trap cleanup EXIT

if [[ ! -x "${serve}" ]]; then
  echo "SERVE 8B: FAILED (missing ${serve})"
  exit 1
fi

# --- serve with random weights, on a free port.
"${serve}" --device "${device}" --random-weights "${model[@]}" "${extra[@]}" \
  --port 0 --port-file "${work}/port" >"${logs}/serve_8b_server.log" 2>&1 &
pid=$!
while [[ ! -s "${work}/port" ]] && (($(date +%s) < deadline)); do
  if ! kill -0 "${pid}" 2>/dev/null; then
    pid=""
    if grep -q "no CUDA device" "${logs}/serve_8b_server.log"; then
      echo "SERVE 8B: skipped (no CUDA device)"
      exit 0
    fi
    tail -5 "${logs}/serve_8b_server.log"
    echo "SERVE 8B: FAILED (serve exited: $(grep -m1 -E 'serve: |Error|error' "${logs}/serve_8b_server.log" | cut -c1-200))"
    exit 1
  fi
  sleep 0.5
done
if [[ ! -s "${work}/port" ]]; then
  echo "SERVE 8B: FAILED (serve did not listen within the budget)"
  exit 1
fi
grep -m1 "serving random weights" "${logs}/serve_8b_server.log" | sed 's/^.*\] //'
grep -m1 "decode steps as CUDA graphs" "${logs}/serve_8b_server.log" | sed 's/^.*\] //'
port="$(cat "${work}/port")"
left=$((deadline - $(date +%s)))
timeout -k 5 "$((left > 10 ? left - 5 : 5))" "${python}" "${scripts}/serve_load.py" \
  "${port}" --clients "${clients}" --requests "${SERVE_REQUESTS:-2}" \
  --max-tokens "${SERVE_MAX_TOKENS:-128}" \
  --prompt-chars "${SERVE_PROMPT_CHARS:-128}" >"${work}/load.txt" 2>&1
load_rc=$?
grep -v '^SERVE LOAD JSON' "${work}/load.txt"
kill "${pid}" 2>/dev/null
wait "${pid}" 2>/dev/null
pid=""
# A size whose capture failed ran eagerly: say so.
grep "run eagerly: their graph capture failed" "${logs}/serve_8b_server.log" | sed 's/^.*\] //' | head -3
if ((load_rc != 0)); then
  echo "SERVE 8B: FAILED (the load client: rc ${load_rc})"
  exit 1
fi
last_c="${clients##* }"
read -r ours itl < <(sed -n "s/^SERVE LOAD clients ${last_c}: \([0-9.]*\) tokens\/s.*inter-token p50 [0-9.]* ms p99 \([0-9.]*\) ms.*/\1 \2/p" "${work}/load.txt")

# --- the peer, in the machine's own PyTorch (not the bundle's libraries).
peer=""
left=$((deadline - $(date +%s)))
if ((left > 20)); then
  read -r -a peer_args <<<"${SERVE_PEER_ARGS:-}"
  env -u LD_LIBRARY_PATH -u MCC_EXPECT_CUDA PYTHONUNBUFFERED=1 \
    timeout -k 5 "$((left - 5))" "${python}" "${scripts}/hf_llama_peer.py" \
    --new-tokens "${SERVE_MAX_TOKENS:-128}" "${peer_args[@]}" >"${work}/peer.txt" 2>&1
  tail -8 "${work}/peer.txt"
  peer="$(sed -n "s/^HF PEER batch ${last_c}: \([0-9.]*\) tokens\/s.*/\1/p" "${work}/peer.txt")"
else
  echo "HF PEER: not run (no time left)"
fi
summary="${last_c} clients: ${ours:-?} tokens/s, p99 inter-token ${itl:-?} ms"
if [[ -n "${peer}" && -n "${ours}" ]]; then
  ratio="$(awk -v a="${ours}" -v b="${peer}" 'BEGIN { printf "%.2f", a / b }')"
  echo "goal: 3x the peer's batch ${last_c} (ratio ${ratio}: $(awk -v r="${ratio}" 'BEGIN { print (r >= 3 ? "met" : "not met") }')), p99 inter-token under 30 ms ($(awk -v t="${itl}" 'BEGIN { print (t < 30 ? "met" : "not met") }'))"
  summary="${summary}; peer batch ${last_c}: ${peer} tokens/s; ratio ${ratio}"
else
  if [[ -s "${work}/peer.txt" ]]; then
    summary="${summary}; peer: $(tail -1 "${work}/peer.txt" | sed 's/^HF PEER: //')"
  else
    summary="${summary}; peer: not run"
  fi
fi
echo "SERVE 8B: ok (${summary})"
