#!/usr/bin/env bash
# tools/gpu/check_serve.sh rehearsed without a GPU: serve_testdev serves a
# tiny Llama shape with random weights on the test device, serve_load.py
# reports tokens/s, time to first token and inter-token latency at 1 and 4
# clients, the peer skips (no torch here) and the summary reads ok; the real
# serve without a GPU skips saying so; a shape serve refuses fails, naming
# serve's reason.
# Args: SERVE_TESTDEV SERVE.
set -uo pipefail
serve_testdev="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
serve="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
scripts="$(cd "$(dirname "$0")" && pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}"
mkdir -p "${work}/bundle"
fail() { echo "FAILED: $*"; exit 1; }
pass() { echo "ok: $*"; }
tiny="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --ffn-hidden-size 128 --vocab-size 1000 --seq-length 128 --max-position-embeddings 128 --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear"

SERVE_BIN="${serve_testdev}" SERVE_DEVICE=test SERVE_MODEL_FLAGS="${tiny}" \
  SERVE_FLAGS="--max-batch-size 8 --kv-cache-bytes 8000000 --num-threads 1 --cuda-graph" \
  SERVE_CLIENTS="1 4" SERVE_MAX_TOKENS=8 SERVE_PROMPT_CHARS=32 SERVE_BUDGET=120 GPU_CHECK_PYTHON=python3 \
  SERVE_PEER_ARGS="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 1000" \
  "${scripts}/check_serve.sh" "${work}/bundle" >"${work}/rehearsal.txt" 2>&1
rc=$?
cat "${work}/rehearsal.txt"
last="$(tail -1 "${work}/rehearsal.txt")"
[[ ${rc} == 0 && "${last}" =~ ^"SERVE 8B: ok (4 clients: "[0-9.]+" tokens/s, p99 inter-token "[0-9.]+" ms; peer: skipped" ]] ||
  fail "rehearsal: rc ${rc}, ${last}"
grep -qE '^SERVE LOAD clients 1: [0-9.]+ tokens/s, TTFT p50 [0-9.]+ ms p99 [0-9.]+ ms, inter-token p50 [0-9.]+ ms p99 [0-9.]+ ms \(2 requests, 16 tokens\)' "${work}/rehearsal.txt" ||
  fail "no 1-client line"
grep -qE '^SERVE LOAD clients 4: .*\(8 requests, 64 tokens\)' "${work}/rehearsal.txt" || fail "no 4-client line"
grep -q 'serving random weights (test-only) on testdev:0: 2 layers, hidden 64' "${work}/rehearsal.txt" ||
  fail "the server's model line is missing"
grep -q 'decode steps as CUDA graphs for up to 8 rows' "${work}/rehearsal.txt" ||
  fail "the server's graph line is missing"
! grep -q 'graph capture failed' "${work}/rehearsal.txt" || fail "a capture failed"
pass "rehearsal on the test device: both concurrencies, graphs, the peer skipped"

SERVE_BIN="${serve}" SERVE_MODEL_FLAGS="${tiny}" SERVE_BUDGET=60 \
  "${scripts}/check_serve.sh" "${work}/bundle" >"${work}/nogpu.txt" 2>&1
rc=$?
[[ ${rc} == 0 && "$(tail -1 "${work}/nogpu.txt")" == "SERVE 8B: skipped (no CUDA device)" ]] ||
  fail "without a GPU: rc ${rc}, $(cat "${work}/nogpu.txt")"
pass "without a GPU: skipped"

SERVE_BIN="${serve_testdev}" SERVE_DEVICE=test SERVE_BUDGET=60 \
  SERVE_MODEL_FLAGS="${tiny/--num-attention-heads 4/--num-attention-heads 3}" \
  "${scripts}/check_serve.sh" "${work}/bundle" >"${work}/bad.txt" 2>&1
rc=$?
[[ ${rc} == 1 && "$(tail -1 "${work}/bad.txt")" == "SERVE 8B: FAILED (serve exited: "* ]] ||
  fail "a refused shape: rc ${rc}, $(cat "${work}/bad.txt")"
pass "a shape serve refuses fails: $(tail -1 "${work}/bad.txt")"
