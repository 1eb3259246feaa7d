#!/usr/bin/env bash
# Runs the prebuilt CUDA test binaries and the CUDA bench on a GPU machine
# without Bazel, each under a timeout, then the train binary's GPU smoke check
# (tools/gpu/check_train_parity.sh: fp32 and bf16 against the CPU), GPT-2
# 124M throughput (tools/gpu/check_gpt2_throughput.sh), --cuda-graph
# against eager (tools/gpu/check_cuda_graph.sh) and, with two GPUs or
# more, the multi-rank layouts and DP scaling (tools/gpu/check_multi_rank.sh),
# and prints one summary line:
#   GPU CHECKS: 7 passed, 0 failed, 0 timed out; skipped tests: 0; bench ok;
#   train parity ok; cuda graph ok; gpt2 throughput ok; multi-rank skipped
#
#   tools/gpu/run_checks.sh [DIR] [--quick]
#
# DIR is a folder made by tools/gpu/collect_libs.sh (DIR/bin, DIR/lib;
# default: gpu_bundle; DIR.tar.xz is unpacked when DIR is absent) or a copied
# bazel-bin tree (then libraries come from
# DIR/../lib if present). LD_LIBRARY_PATH gets DIR/lib first, then
# /usr/local/cuda/lib64. --quick runs the bench with fewer iterations and
# no GEMM sweep. Per-step timeouts: STEP_TIMEOUT (default 300 s) and
# BENCH_TIMEOUT (default 420 s), all cut to fit RUN_CHECKS_BUDGET (default
# 560 s) for the whole script, so it ends within the device tool's 10
# minutes (the train checks get the deadline as GPU_CHECK_DEADLINE). Logs go
# to DIR/logs/.
set -uo pipefail

dir="gpu_bundle"
quick=0
for arg in "$@"; do
  case "${arg}" in
    --quick) quick=1 ;;
    *) dir="${arg}" ;;
  esac
done
# A bundle carried packed (tar -cJf gpu_bundle.tar.xz gpu_bundle: about
# 17 MB against 85 MB unpacked; the device tool carries 64 MiB): unpacked
# beside its tarball first.
if [[ ! -d "${dir}" && -f "${dir}.tar.xz" ]]; then
  tar -xJf "${dir}.tar.xz" -C "$(dirname "${dir}")" || exit 1
fi
bin="${dir}/bin"
[[ -d "${bin}" ]] || bin="${dir}"
lib="${dir}/lib"
[[ -d "${lib}" ]] || lib="${dir}/../lib"
export LD_LIBRARY_PATH="$(cd "${lib}" 2>/dev/null && pwd):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
logs="${dir}/logs"
mkdir -p "${logs}"
step_timeout="${STEP_TIMEOUT:-300}"
bench_timeout="${BENCH_TIMEOUT:-420}"
export GPU_CHECK_DEADLINE=$(($(date +%s) + ${RUN_CHECKS_BUDGET:-560}))
# The tests and the bench leave TRAIN_CHECKS_RESERVE (default 300 s) of the
# budget to the train checks (parity about a minute, throughput at most
# THROUGHPUT_BUDGET, 200 s).
tests_deadline=$((GPU_CHECK_DEADLINE - ${TRAIN_CHECKS_RESERVE:-300}))
# capped SECONDS: SECONDS cut to what the tests' share leaves (at least 1).
capped() {
  local left=$((tests_deadline - $(date +%s)))
  ((left < $1)) && echo $((left > 1 ? left : 1)) || echo "$1"
}

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
  timeout "$(capped "${step_timeout}")" "${exe}" >"${log}" 2>&1
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
  timeout "$(capped "${bench_timeout}")" "${bench}" "${bench_args[@]}" 2>&1 | tee "${logs}/bench.log"
  rc=${PIPESTATUS[0]}
  case ${rc} in
    0) bench_state="ok" ;;
    124) bench_state="timeout" ;;
    *) bench_state="rc=${rc}" ;;
  esac
fi

# section NAME SCRIPT PREFIX: runs a train check (each skips without a
# GPU), which ends with one line "PREFIX: ok|skipped|FAILED ..."; sets
# section_state.
section() {
  local script="$(dirname "$0")/$2" line
  section_state="missing"
  [[ -x "${script}" ]] || return
  "${script}" "${dir}" 2>&1 | tee "${logs}/$1.log"
  line="$(tail -1 "${logs}/$1.log")"
  case "${line}" in
    "$3: ok"*) section_state="ok" ;;
    "$3: skipped"*) section_state="skipped" ;;
    *) section_state="failed" ;;
  esac
}
# train on the GPU against train on the CPU.
section train_parity check_train_parity.sh "TRAIN PARITY"
train_parity="${section_state}"
# --cuda-graph against eager on the GPU (losses, step times); the tiny
# model, so 90 s per run is ample and keeps the budget.
STEP_TIMEOUT="${CUDA_GRAPH_TIMEOUT:-90}" section cuda_graph check_cuda_graph.sh "CUDA GRAPH"
cuda_graph="${section_state}"
section gpt2_throughput check_gpt2_throughput.sh "GPT2 THROUGHPUT"
throughput="${section_state}"
section multi_rank check_multi_rank.sh "MULTI-RANK"
multi_rank="${section_state}"

echo "time: ${SECONDS} s of the ${RUN_CHECKS_BUDGET:-560} s budget"
echo "GPU CHECKS: ${passed} passed, ${failed} failed, ${timed_out} timed out;" \
  "skipped tests: ${skipped}; bench ${bench_state}; train parity" \
  "${train_parity}; cuda graph ${cuda_graph}; gpt2 throughput" \
  "${throughput}; multi-rank" \
  "${multi_rank}${failures:+; failing: ${failures[*]}}"
[[ ${failed} -eq 0 && ${timed_out} -eq 0 && "${bench_state}" == "ok" &&
  "${train_parity}" != "failed" && "${train_parity}" != "missing" &&
  "${cuda_graph}" != "failed" && "${cuda_graph}" != "missing" &&
  "${throughput}" != "failed" && "${throughput}" != "missing" &&
  "${multi_rank}" != "failed" && "${multi_rank}" != "missing" ]]
