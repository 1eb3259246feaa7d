#!/usr/bin/env bash
# Runs the GPU machine's train checks here, with the test device
# (//tools:train_testdev --device test: CPU kernels behind a device's wall)
# standing in for the GPU, so CI runs their comparison paths:
# - check_train_parity.sh: test device against the CPU passes in fp32 and
#   bf16; a planted mismatch (--seed 7 on the device run only) fails.
# - check_multi_rank.sh (two "GPUs" claimed): TP 2 + SP, PP 2 and DP 2 +
#   ZeRO-1 under tools/launch match the serial run and the DP scaling figure
#   prints; a planted mismatch fails.
# - check_gpt2_throughput.sh on a tiny model: an out-of-memory micro-batch
#   (a wrapper that fails as train does) falls back to the next size, and
#   the figures and the MFU reference are printed; all sizes out of memory
#   fails.
# - check_cuda_graph.sh: --cuda-graph on the test device matches eager and
#   counts its replays; a planted mismatch fails.
# - Without a GPU (the user binary, --device cuda) each check skips.
#   train_checks_test.sh LAUNCH TRAIN_TESTDEV TRAIN
set -uo pipefail
abs() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
launch=$(abs "$1")
train_dev=$(abs "$2")
train=$(abs "$3")
scripts="$(cd "$(dirname "$0")" && pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}"

# A bundle as tools/gpu/collect_libs.sh makes one, holding BINARY as train.
make_bundle() {
  mkdir -p "$1/bin/tools" "$1/lib" "$1/data"
  ln -sf "$2" "$1/bin/tools/train"
  ln -sf "${launch}" "$1/bin/tools/launch"
  cp "${work}/corpus/runs/default/data/default_corpus_text_document".{bin,idx} \
    "$1/data/"
}
# The default corpus, written by train as collect_libs.sh has it written.
mkdir -p "${work}/corpus"
(cd "${work}/corpus" && "${train}" --device cpu --train-iters 1 --eval-iters 0 \
  --peak-tflops 1 --num-threads 1 >train.log 2>&1) ||
  { cat "${work}/corpus/train.log"; exit 1; }
make_bundle "${work}/dev" "${train_dev}"
make_bundle "${work}/user" "${train}"

# A smaller tiny GPT than the GPU runs (the flags come after the checks' own
# model flags where those set none), to fit CI's 2 cores.
export GPU_CHECK_DEVICE=test
export GPU_CHECK_EXTRA_FLAGS="--num-threads 1 --num-layers 2 --seq-length 32"
failures=0
# expect NAME RC PATTERN... -- COMMAND...: COMMAND exits RC, its output
# holds every PATTERN (grep -E) and ends with the check's summary line
# (run_checks.sh reads the last line).
expect() {
  local name="$1" want_rc="$2" patterns=() out rc
  shift 2
  while [[ "$1" != -- ]]; do patterns+=("$1"); shift; done
  shift
  local start=${SECONDS}
  out="$("$@" 2>&1)"
  rc=$?
  local ok=1
  [[ ${rc} == "${want_rc}" ]] || ok=0
  for p in "${patterns[@]}"; do grep -qE -- "${p}" <<<"${out}" || ok=0; done
  tail -1 <<<"${out}" | grep -qE '^(TRAIN PARITY|GPT2 THROUGHPUT|MULTI-RANK|CUDA GRAPH): ' || ok=0
  if ((ok)); then
    echo "PASS ${name} ($((SECONDS - start)) s)"
  else
    echo "FAIL ${name}: rc ${rc} (want ${want_rc}), wanted ${patterns[*]}; output:"
    echo "${out}"
    failures=$((failures + 1))
  fi
}

expect "parity: test device = cpu in fp32 and bf16" 0 \
  '^TRAIN PARITY fp32: ok \(6 steps, max relative difference 0; tolerance 1e-4\)' \
  '^TRAIN PARITY bf16: ok \(6 steps' 'device testdev:0' \
  '^TRAIN PARITY: ok \(fp32 bf16; 6 steps, test against cpu\)$' -- \
  env PARITY_STEPS=6 "${scripts}/check_train_parity.sh" "${work}/dev"
expect "parity: optimizer offload on the test device = cpu" 0 \
  '^TRAIN PARITY fp32: ok \(4 steps, max relative difference 0; tolerance 1e-4\)' \
  '^TRAIN PARITY: ok \(fp32; 4 steps, test against cpu\)$' -- \
  env PARITY_STEPS=4 PARITY_PRECISIONS=fp32 PARITY_NAME=parity_offload \
  GPU_CHECK_CANDIDATE_FLAGS="--optimizer-cpu-offload --optimizer-offload-fraction 0.5" \
  "${scripts}/check_train_parity.sh" "${work}/dev"
expect "parity: planted mismatch fails" 1 '  iteration [0-9]+: reference [0-9.e+-]+, under test' \
  '^TRAIN PARITY fp32: FAILED \([1-6] of 6 steps beyond 1e-4' \
  '^TRAIN PARITY: FAILED \(fp32: test differs from cpu beyond 1e-4\)$' -- \
  env PARITY_STEPS=6 PARITY_PRECISIONS=fp32 GPU_CHECK_CANDIDATE_FLAGS="--seed 7" \
  "${scripts}/check_train_parity.sh" "${work}/dev"

expect "cuda graph: graphed = eager on the test device" 0 \
  '^CUDA GRAPH losses: ok \(4 steps, max relative difference 0; tolerance 1e-6\)' \
  '^CUDA GRAPH: ok \(4 steps; [0-9]+ replays; step [0-9.]+ ms eager, [0-9.]+ ms graphed\)$' -- \
  env CUDA_GRAPH_STEPS=4 "${scripts}/check_cuda_graph.sh" "${work}/dev"
expect "cuda graph: planted mismatch fails" 1 '  iteration [0-9]+: reference [0-9.e+-]+, under test' \
  '^CUDA GRAPH: FAILED \(graphed losses differ from eager beyond 1e-6\)$' -- \
  env CUDA_GRAPH_STEPS=4 GPU_CHECK_CANDIDATE_FLAGS="--seed 7" \
  "${scripts}/check_cuda_graph.sh" "${work}/dev"

expect "multi-rank: TP 2 + SP, PP 2, DP 2 + ZeRO-1 = serial; DP scaling" 0 \
  '^MULTI-RANK tp2_sp: ok \(4 steps' '^MULTI-RANK pp2: ok \(4 steps' \
  '^MULTI-RANK dp2_zero1: ok \(4 steps' \
  '^DP scaling efficiency: [0-9.]+% \(DP 2: [0-9]+ tokens/s; one GPU: [0-9]+ tokens/s; micro-batch 4 per GPU' \
  '^MULTI-RANK: ok \(tp2_sp pp2 dp2_zero1; DP scaling [0-9.]+%\)$' -- \
  env GPU_CHECK_GPUS=2 MULTI_RANK_STEPS=4 SCALING_ITERS=5 \
  SCALING_MODEL_FLAGS="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --micro-batch-size 4" \
  "${scripts}/check_multi_rank.sh" "${work}/dev"
expect "multi-rank: planted mismatch fails" 1 \
  '^MULTI-RANK dp2_zero1: FAILED \([1-4] of 4 steps beyond 1e-5' \
  '^MULTI-RANK: FAILED \(dp2_zero1 differs from one GPU beyond 1e-5\)$' -- \
  env GPU_CHECK_GPUS=2 MULTI_RANK_STEPS=4 SCALING_ITERS=0 \
  MULTI_RANK_LAYOUTS=dp2_zero1 GPU_CHECK_CANDIDATE_FLAGS="--seed 7" \
  "${scripts}/check_multi_rank.sh" "${work}/dev"

# A train that runs out of device memory above micro-batch 4, failing as
# train does (a fatal log line naming the device, then abort).
mkdir -p "${work}/oom/bin/tools" "${work}/oom/logs"
cat >"${work}/oom/bin/tools/train" <<WRAPPER
#!/usr/bin/env bash
args=" \$* "
if [[ "\${args}" != *" --micro-batch-size 4 "* ]]; then
  echo "F1202 00:00:00.000000 1 tensor.cc:30] out of memory on testdev:0 allocating 1 GiB" >&2
  exit 134
fi
exec "${train_dev}" "\$@"
WRAPPER
chmod +x "${work}/oom/bin/tools/train"
echo "cuBLAS bf16 GEMM 4096^3: 1000000.0 TFLOP/s (reference below)" \
  >"${work}/oom/logs/bench.log"
tiny="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --bf16"
expect "throughput: out of memory falls back; figures and MFU reference" 0 \
  '^micro-batch 16: out of device memory \(rc=134, out of memory on testdev:0\); trying a smaller one$' \
  '^micro-batch 8: out of device memory' \
  'micro-batch 4, 3 timed steps:$' '^  tokens/s +[0-9]+$' \
  '^  dense bf16 GEMM [0-9.]+ TFLOP/s measured by train \(cuBLASLt 4096\^3\), 1000000.0 by the bench' \
  '^  MFU +0.0% against 1000000.0 TFLOP/s \(.*\); goal 45%: NOT met$' \
  '^  peak memory +[0-9.]+ GiB$' '^  peers: llm.c GPT-2 124M about 60% MFU on A100' \
  '^loss [0-9.]+ -> [0-9.]+ \((falls|does not fall)\)$' \
  '^planner: step [0-9.]+ ms predicted, [0-9.]+ ms measured \([-+][0-9]+%\); peak memory [0-9.]+ GiB predicted' \
  '^GPT2 THROUGHPUT: ok \(micro-batch 4: [0-9]+ tokens/s, MFU 0.0% \(goal 45%: not met\), peak memory' -- \
  env THROUGHPUT_MICRO_BATCHES="16 8 4" THROUGHPUT_ITERS=6 \
  THROUGHPUT_MODEL_FLAGS="${tiny}" "${scripts}/check_gpt2_throughput.sh" "${work}/oom"
expect "throughput: every micro-batch out of memory fails" 1 \
  '^GPT2 THROUGHPUT: FAILED \(no micro-batch of 16 8 ran\)$' -- \
  env THROUGHPUT_MICRO_BATCHES="16 8" THROUGHPUT_MODEL_FLAGS="${tiny}" \
  "${scripts}/check_gpt2_throughput.sh" "${work}/oom"
expect "throughput: a failing run (not out of memory) fails" 1 \
  '^GPT2 THROUGHPUT: FAILED \(micro-batch 4: rc=[1-9][0-9]*; log ' -- \
  env THROUGHPUT_MICRO_BATCHES="4" THROUGHPUT_MODEL_FLAGS="${tiny} --num-attention-heads 5" \
  "${scripts}/check_gpt2_throughput.sh" "${work}/oom"

# Without a GPU: the user binary refuses --device cuda and every check skips.
if [[ ! -e /dev/nvidia0 ]]; then
  expect "no GPU: parity skips" 0 '^TRAIN PARITY: skipped \(no CUDA device\)$' -- \
    env GPU_CHECK_DEVICE=cuda "${scripts}/check_train_parity.sh" "${work}/user"
  expect "no GPU: throughput skips" 0 '^GPT2 THROUGHPUT: skipped \(no CUDA device\)$' -- \
    env GPU_CHECK_DEVICE=cuda "${scripts}/check_gpt2_throughput.sh" "${work}/user"
  expect "no GPU: multi-rank skips" 0 '^MULTI-RANK: skipped \(0 GPUs\)$' -- \
    env GPU_CHECK_DEVICE=cuda "${scripts}/check_multi_rank.sh" "${work}/user"
  expect "no GPU: cuda graph skips" 0 '^CUDA GRAPH: skipped \(no CUDA device\)$' -- \
    env GPU_CHECK_DEVICE=cuda "${scripts}/check_cuda_graph.sh" "${work}/user"
fi
expect "one GPU: multi-rank skips" 0 '^MULTI-RANK: skipped \(1 GPU\)$' -- \
  env GPU_CHECK_GPUS=1 "${scripts}/check_multi_rank.sh" "${work}/user"

if ((failures)); then
  echo "${failures} check(s) failed"
  exit 1
fi
echo "train checks: OK"
