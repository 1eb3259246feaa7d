#!/usr/bin/env bash
# Runs the prebuilt CUDA test binaries and the CUDA bench on a GPU machine
# without Bazel, each under a timeout, then the train binary's GPU smoke check
# (tools/gpu/check_train_parity.sh), and prints one summary line:
#   GPU CHECKS: 7 passed, 0 failed, 0 timed out; skipped tests: 0; bench ok;
#   train parity ok
#
#   tools/gpu/run_checks.sh [DIR] [--quick]
#
# DIR is a folder made by tools/gpu/collect_libs.sh (DIR/bin, DIR/lib;
# default: gpu_bundle) or a copied bazel-bin tree (then libraries come from
# DIR/../lib if present). LD_LIBRARY_PATH gets DIR/lib first, then
# /usr/local/cuda/lib64. --quick runs the bench with fewer iterations and
# no GEMM sweep. Per-step timeouts: STEP_TIMEOUT (default 300 s) and
# BENCH_TIMEOUT (default 420 s). Logs go to DIR/logs/.
set -uo pipefail

dir="gpu_bundle"
quick=0
for arg in "$@"; do
  case "${arg}" in
    --quick) quick=1 ;;
    *) dir="${arg}" ;;
  esac
done
bin="${dir}/bin"
[[ -d "${bin}" ]] || bin="${dir}"
lib="${dir}/lib"
[[ -d "${lib}" ]] || lib="${dir}/../lib"
export LD_LIBRARY_PATH="$(cd "${lib}" 2>/dev/null && pwd):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
logs="${dir}/logs"
mkdir -p "${logs}"
step_timeout="${STEP_TIMEOUT:-300}"
bench_timeout="${BENCH_TIMEOUT:-420}"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader

tests=(
  core/cuda/runtime_nodevice_test
  core/cuda/runtime_test
  core/cuda/staging_test
  core/cuda/activation_offload_test
  core/ops/cuda/registrations_nodevice_test
  core/ops/cuda/registrations_test
  core/ops/cuda/gemm_test
  core/ops/cuda/flash_attention_test
  core/ops/cuda/cached_attention_test
  parallel/context_parallel/softmax_merge_cuda_test
  core/ops/cuda/int8_test
  core/ops/cuda/index_check_loss_totals_test
  core/ops/cuda/graph_capture_test
  core/ops/cuda/slot_coverage_test
  core/comm/nccl_process_group_test
)
passed=0 failed=0 timed_out=0 skipped=0 failures=()
for t in "${tests[@]}"; do
  exe="${bin}/${t}"
  log="${logs}/$(basename "${t}").log"
  if [[ ! -x "${exe}" ]]; then
    echo "MISSING ${t}"
    failed=$((failed + 1))
    failures+=("${t}(missing)")
    continue
  fi
  timeout "${step_timeout}" "${exe}" >"${log}" 2>&1
  rc=$?
  n_skip=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "${log}" || true)
  skipped=$((skipped + n_skip))
  if [[ ${rc} -eq 0 ]]; then
    passed=$((passed + 1))
    echo "PASS ${t} (${n_skip} skipped)"
  elif [[ ${rc} -eq 124 ]]; then
    timed_out=$((timed_out + 1))
    failures+=("${t}(timeout)")
    echo "TIMEOUT ${t} after ${step_timeout}s; log ${log}"
  else
    failed=$((failed + 1))
    failures+=("${t}(rc=${rc})")
    echo "FAIL ${t} rc=${rc}; log ${log}:"
    grep -E 'Failure|error|FAILED|Check failed' "${log}" | head -20
  fi
done

bench="${bin}/core/ops/cuda/bench"
bench_state="missing"
if [[ -x "${bench}" ]]; then
  bench_args=()
  ((quick)) && bench_args=(--iters=5 --gemm=false --mem_elements=16777216)
  timeout "${bench_timeout}" "${bench}" "${bench_args[@]}" 2>&1 | tee "${logs}/bench.log"
  rc=${PIPESTATUS[0]}
  case ${rc} in
    0) bench_state="ok" ;;
    124) bench_state="timeout" ;;
    *) bench_state="rc=${rc}" ;;
  esac
fi

# train on the GPU against train on the CPU (tools/gpu/check_train_parity.sh:
# skips without a GPU).
train_parity="missing"
parity_script="$(dirname "$0")/check_train_parity.sh"
if [[ -x "${parity_script}" ]]; then
  parity_line="$("${parity_script}" "${dir}" | tee "${logs}/train_parity.log" | tail -1)"
  echo "${parity_line}"
  case "${parity_line}" in
    "TRAIN PARITY: ok"*) train_parity="ok" ;;
    "TRAIN PARITY: skipped"*) train_parity="skipped" ;;
    *) train_parity="failed" ;;
  esac
fi

echo "GPU CHECKS: ${passed} passed, ${failed} failed, ${timed_out} timed out;" \
  "skipped tests: ${skipped}; bench ${bench_state}; train parity" \
  "${train_parity}${failures:+; failing: ${failures[*]}}"
[[ ${failed} -eq 0 && ${timed_out} -eq 0 && "${bench_state}" == "ok" &&
  "${train_parity}" != "failed" && "${train_parity}" != "missing" ]]
