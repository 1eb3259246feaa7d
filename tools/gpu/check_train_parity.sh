#!/usr/bin/env bash
# The train binary's GPU smoke check, on a GPU machine without Bazel: the
# tiny GPT (train's default model: 4 layers, hidden 128, sequence 128) for
# 20 steps in fp32 with TF32 off, once with --device cuda and once with
# --device cpu, the flags otherwise identical; every step's loss must agree
# within 1e-4 (relative). Prints one line:
#   TRAIN PARITY: ok (20 steps, max relative difference 3.1e-07)
#   TRAIN PARITY: skipped (no CUDA device)
#   TRAIN PARITY: FAILED (...)
#
#   tools/gpu/check_train_parity.sh [DIR]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle):
# DIR/bin/tools/train and the default corpus it carries in DIR/data (the
# GPU machine need not have the Debian packages the corpus comes from).
# Logs go to DIR/logs/train_{cuda,cpu}.log. Exit status: 0 ok or skipped,
# 1 failed. STEP_TIMEOUT (default 300 s) bounds each run.
set -uo pipefail

dir="${1:-gpu_bundle}"
bin="${dir}/bin"
[[ -d "${bin}" ]] || bin="${dir}"
train="${bin}/tools/train"
data="${dir}/data/default_corpus_text_document"
lib="${dir}/lib"
[[ -d "${lib}" ]] || lib="${dir}/../lib"
# As run_checks.sh: the bundle's libraries, then the machine's CUDA.
export LD_LIBRARY_PATH="$(cd "${lib}" 2>/dev/null && pwd):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
logs="${dir}/logs"
mkdir -p "${logs}"
step_timeout="${STEP_TIMEOUT:-300}"
tolerance=1e-4

if [[ ! -x "${train}" ]]; then
  echo "TRAIN PARITY: FAILED (missing ${train}; run tools/gpu/collect_libs.sh)"
  exit 1
fi
if [[ ! -f "${data}.bin" || ! -f "${data}.idx" ]]; then
  echo "TRAIN PARITY: FAILED (missing ${data}.{bin,idx}; collect_libs.sh" \
    "writes them beside the train binary)"
  exit 1
fi

# fp32 GEMMs in full fp32 (the TF32 override covers cuBLAS and cuBLASLt).
export NVIDIA_TF32_OVERRIDE=0
flags=(--data-path "${data}" --data-cache-path "${logs}/train_data_cache"
       --train-iters 20 --lr-decay-iters 20 --log-interval 1 --eval-iters 0
       --peak-tflops 1)
for device in cuda cpu; do
  # --metrics-file appends: start each run's file afresh.
  rm -f "${logs}/train_${device}.jsonl"
  timeout "${step_timeout}" "${train}" "${flags[@]}" --device "${device}" \
    --metrics-file "${logs}/train_${device}.jsonl" \
    >"${logs}/train_${device}.log" 2>&1
  rc=$?
  if [[ ${device} == cuda && ${rc} -eq 2 ]] &&
    grep -q -- '--device cuda: no CUDA device' "${logs}/train_cuda.log"; then
    echo "TRAIN PARITY: skipped (no CUDA device)"
    exit 0
  fi
  if [[ ${rc} -ne 0 ]]; then
    echo "TRAIN PARITY: FAILED (--device ${device}: rc=${rc}; log" \
      "${logs}/train_${device}.log)"
    tail -5 "${logs}/train_${device}.log"
    exit 1
  fi
done

grep -h 'device cuda' "${logs}/train_cuda.log" | sed 's/^.*\] //'
# "iteration loss" per metrics line.
losses() {
  sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"
}
awk -v tol="${tolerance}" '
  NR == FNR { ref[$1] = $2; next }
  ($1 in ref) {
    d = ref[$1] - $2; if (d < 0) d = -d
    m = ref[$1] < 0 ? -ref[$1] : ref[$1]
    r = m > 0 ? d / m : d
    if (r > worst) worst = r
    n++
    if (r > tol) { printf "  iteration %d: cpu %s cuda %s\n", $1, ref[$1], $2; bad++ }
  }
  END {
    if (n != 20) { printf "TRAIN PARITY: FAILED (%d common steps, not 20)\n", n; exit 1 }
    if (bad) { printf "TRAIN PARITY: FAILED (%d of 20 steps beyond %s)\n", bad, tol; exit 1 }
    printf "TRAIN PARITY: ok (20 steps, max relative difference %.2g)\n", worst
  }' <(losses "${logs}/train_cpu.jsonl") <(losses "${logs}/train_cuda.jsonl")
