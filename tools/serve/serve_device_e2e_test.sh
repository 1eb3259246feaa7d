#!/bin/bash
# serve --device: the engine on a device (here the test device, CPU kernels
# behind a GPU's wall) answers the CPU engine's greedy tokens on the same
# fp32 checkpoint through both APIs, refuses a request longer than its KV
# pool with a 400, logs where it runs, serves int8 and FP8 weights as the
# CPU engine does (logging their bytes against bf16's), and quantises
# --random-weights on the device with --quantize. At TP 2 (two processes,
# the TP group's tensors on the test device through gloo) it answers the
# same tokens, and with --batch-invariant concurrent requests equal the
# same requests alone; an MoE checkpoint at TP 2 too.
# Args: TRAIN SERVE_TESTDEV CLIENT LAUNCH.
set -euo pipefail
train=$1
serve=$2
client=$3
launch=$4
python=/usr/bin/python3
[[ -x $python ]] || python=python3
work=${TEST_TMPDIR:-$(mktemp -d)}
model=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
       --num-attention-heads 4 --seq-length 64 --num-threads 1)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

"$train" "${model[@]}" --micro-batch-size 2 --train-iters 6 \
  --save "$work/ckpt" > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail train; }

start() {  # start NAME FLAGS...: sets $port and $pid ($nproc processes)
  local name=$1
  shift
  rm -f "$work/$name.port"
  local prefix=()
  [[ ${nproc:-1} == 1 ]] || prefix=("$launch" --nproc_per_node "$nproc" --)
  "${prefix[@]}" "$serve" --port 0 --port-file "$work/$name.port" --num-threads 1 \
    --load "${ckpt:-$work/ckpt}" "$@" > "$work/$name.log" 2>&1 &
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
# same_as_cpu ANSWER [REFERENCE]: the CPU engine's greedy tokens and text
# (greedy_cpu.json unless given), log-probabilities within 2e-4 (fp32
# summation orders).
same_as_cpu() {
  "$python" - "${2:-$work/greedy_cpu.json}" "$1" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] and a["text"] == b["text"], (a, b)
for x, y in zip(a["logprobs"], b["logprobs"]):
    assert len(x) == len(y) and all(abs(u - v) < 2e-4 for u, v in zip(x, y)), (x, y)
PY
}

start cpu --device cpu
"$python" "$client" "$port" --only greedy > "$work/greedy_cpu.json"
stop "$pid"

# 4 layers x 4 heads x 16 dims, blocks of 16 positions: 32 KiB a block
# (keys and values, fp32), so 65536 bytes hold 2 blocks = 32 positions.
start dev --device test --kv-cache-bytes 65536 --max-batch-size 4 --cuda-graph
"$python" "$client" "$port" --only greedy > "$work/greedy_dev.json"
same_as_cpu "$work/greedy_dev.json" || fail "the device answers differently from the CPU"
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": "Hello", "max_tokens": 40}')
[[ $code == 400 ]] && grep -q "pool holds only 2" "$work/err.json" \
  || fail "a request longer than the pool: $code $(cat "$work/err.json")"
[[ $(curl -s "http://127.0.0.1:$port/health") == '{"status":"ok"}' ]] || fail "/health after the long request"
grep -q "on testdev:0 .*weights .* in fp32, KV cache 2 blocks of 16 positions" "$work/dev.log" && grep -q "decode steps as CUDA graphs for up to 4 rows" "$work/dev.log" \
  || { cat "$work/dev.log"; fail "the log does not say where the engine runs"; }
stop "$pid"

# TP 2 on the test device: the row-parallel sums and the vocab-parallel
# embedding and logits go over the device's TP group.
nproc=2 start tp2 --device test --tensor-model-parallel-size 2 --max-batch-size 8 \
  --batch-invariant
"$python" "$client" "$port" --only greedy > "$work/greedy_tp2.json"
same_as_cpu "$work/greedy_tp2.json" || fail "TP 2 on the device answers differently from the CPU"
"$python" "$client" "$port" --only concurrent || { cat "$work/tp2.log"; fail "TP 2 on the device: batched differs from alone"; }
grep -q "on testdev:0 .*; TP 2; weights .* a rank in fp32" "$work/tp2.log" \
  || { cat "$work/tp2.log"; fail "the TP 2 log does not say its layout"; }
stop "$pid"
# An MoE model (4 experts top-2, a gated shared expert) on the device at
# TP 2: every TP rank runs the whole MoE layer, as the CPU engine does.
"$train" "${model[@]}" --micro-batch-size 2 --train-iters 6 --disable-bias-linear \
  --swiglu --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 \
  --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate \
  --save "$work/ckpt_moe" > "$work/train_moe.log" 2>&1 || { cat "$work/train_moe.log"; fail "train moe"; }
ckpt=$work/ckpt_moe start cpu_moe --device cpu
"$python" "$client" "$port" --only greedy > "$work/greedy_cpu_moe.json"
stop "$pid"
ckpt=$work/ckpt_moe nproc=2 start tp2_moe --device test --tensor-model-parallel-size 2 \
  --batch-invariant
"$python" "$client" "$port" --only greedy > "$work/greedy_tp2_moe.json"
stop "$pid"
same_as_cpu "$work/greedy_tp2_moe.json" "$work/greedy_cpu_moe.json" \
  || fail "MoE at TP 2 on the device answers differently from the CPU"

if "$launch" --nproc_per_node 2 -- "$serve" --load "$work/ckpt" --device test \
    --tensor-model-parallel-size 2 --cuda-graph --port 0 > "$work/tp2graph.log" 2>&1; then
  fail "--cuda-graph at TP 2 on a device was accepted"
fi
grep -q "decode graphs (--cuda-graph) with --tensor-model-parallel-size > 1 are not built" "$work/tp2graph.log" \
  || { cat "$work/tp2graph.log"; fail "--cuda-graph at TP 2: no reason given"; }

# Quantised weights on the device (int8 values, E4M3 codes: one byte a
# weight there, decoded inside the GEMMs): the CPU engine's greedy tokens on
# the same quantised model, and the log gives the linear layers' bytes
# against bf16's.
for q in int8 fp8; do
  start "cpu_$q" --device cpu --quantize "$q"
  "$python" "$client" "$port" --only greedy > "$work/greedy_cpu_$q.json"
  stop "$pid"
  start "dev_$q" --device test --quantize "$q"
  "$python" "$client" "$port" --only greedy > "$work/greedy_dev_$q.json"
  stop "$pid"
  same_as_cpu "$work/greedy_dev_$q.json" "$work/greedy_cpu_$q.json" \
    || fail "--quantize $q: the device answers differently from the CPU"
  grep -E "on testdev:0 .*\(linear layers (int8|FP8 \(E4M3\)): .* instead of .* in bf16, 1\.9[0-9]x less\)" "$work/dev_$q.log" \
    || { cat "$work/dev_$q.log"; fail "--quantize $q on a device: the log gives no weight bytes"; }
done

# --random-weights --quantize fp8: the weights drawn dense and quantised on
# the device (the GPU script's way to an 8B-shaped FP8 decode), serving.
rm -f "$work/random.port"
"$serve" --device test --random-weights --quantize fp8 --port 0 \
  --port-file "$work/random.port" --num-threads 1 --vocab-size 512 \
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
  > "$work/random_fp8.log" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 600); do
  [[ -s "$work/random.port" ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/random_fp8.log"; fail "random fp8 exited"; }
  sleep 0.2
done
port=$(cat "$work/random.port")
code=$(curl -s -o "$work/random.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
  -d '{"prompt": "Hi", "max_tokens": 3, "temperature": 0}')
[[ $code == 200 ]] || fail "random fp8 weights: $code $(cat "$work/random.json")"
grep -E "linear layers FP8 \(E4M3\), quantised on the device: .* instead of .* in bf16, 1\.[89][0-9]x less" "$work/random_fp8.log" \
  || { cat "$work/random_fp8.log"; fail "--random-weights --quantize fp8: the log gives no weight bytes"; }
stop "$pid"
echo "serve --device checks passed"
