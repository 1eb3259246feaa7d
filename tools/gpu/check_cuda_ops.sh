#!/usr/bin/env bash
# The CUDA kernel check in one call on a GPU machine: every gpu-tagged test
# of the CUDA kernels (each registered kernel against the CPU kernel, the
# cuBLAS GEMMs, the CUDA runtime), prebuilt here and run there without
# Bazel, with one line per test binary and a summary:
#   PASS core/ops/cuda/registrations_test (15 tests)
#   FAIL core/ops/cuda/gemm_test: CudaGemmTest.Batched ...
#   CUDA OPS CHECK: 5 passed, 0 failed
#
# Here (Bazel, no GPU needed):
#   tools/gpu/check_cuda_ops.sh prepare [DIR]    # default DIR: gpu_ops_bundle
# builds the tests and gathers them with their shared libraries into DIR
# (tools/gpu/collect_libs.sh: about 50 MB; NCCL and cuBLAS stay behind and
# come from the GPU machine: check_lib.sh's gpu_library_path). The whole
# call, bench and train checks included, is tools/gpu/run_checks.sh. gpu_ops_bundle is
# git-ignored: carry it to the GPU machine (the device tool's carry).
# There (the GPU machine, one call, well under a minute):
#   tools/gpu/check_cuda_ops.sh [DIR] [--sanitize]
# --sanitize also runs the kernel tests under compute-sanitizer memcheck
# where the machine has it. A skipped GPU test counts as a failure: it saw
# no device, so nothing was checked (the no-device tests skip by design). STEP_TIMEOUT (default 240 s) bounds each
# binary. Logs go to DIR/logs/. Exit status 0 only when everything passed.
set -uo pipefail

mapfile -t tests < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' \
  "$(dirname "$0")/kernel_tests.txt")
root="$(cd "$(dirname "$0")/../.." && pwd)"

if [[ "${1:-}" == "prepare" ]]; then
  dir="${2:-gpu_ops_bundle}"
  targets=()
  for t in "${tests[@]}"; do targets+=("//${t%/*}:${t##*/}"); done
  (cd "${root}" && tools/bazel build "${targets[@]}") || exit 1
  rm -rf "${dir}"
  binaries=()
  for t in "${tests[@]}"; do binaries+=("${root}/bazel-out/k8-opt/bin/${t}"); done
  "${root}/tools/gpu/collect_libs.sh" "${dir}" "${binaries[@]}" || exit 1
  mkdir -p "${dir}/logs"
  echo "prepared ${dir} ($(du -sh "${dir}" | cut -f1)); on the GPU machine run:"
  echo "  tools/gpu/check_cuda_ops.sh ${dir}"
  exit 0
fi

dir="gpu_ops_bundle"
sanitize=0
for arg in "$@"; do
  case "${arg}" in
    --sanitize) sanitize=1 ;;
    *) dir="${arg}" ;;
  esac
done
bin="${dir}/bin"
lib="${dir}/lib"
if [[ ! -d "${bin}" ]]; then
  echo "CUDA OPS CHECK: no bundle at ${dir} (run 'tools/gpu/check_cuda_ops.sh prepare ${dir}' where Bazel is)"
  exit 2
fi
# The bundle's libraries, LD_LIBRARY_PATH, /usr/local/cuda/lib64, then the
# PyTorch environment's nvidia wheels (NCCL, cuBLAS, cuDNN).
source "${root}/tools/gpu/check_lib.sh"
gpu_library_path "${lib}"
logs="${dir}/logs"
mkdir -p "${logs}"
step_timeout="${STEP_TIMEOUT:-240}"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "nvidia-smi missing or failing: the tests will say whether they see a GPU"
fi

passed=0 failed=0
for t in "${tests[@]}"; do
  exe="${bin}/${t}"
  log="${logs}/$(basename "${t}").log"
  if [[ ! -x "${exe}" ]]; then
    echo "FAIL ${t}: missing from ${dir}"
    failed=$((failed + 1))
    continue
  fi
  timeout -k 5 "${step_timeout}" "${exe}" >"${log}" 2>&1
  rc=$?
  ran=$(grep -cE '^\[       OK \]' "${log}")
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "${log}")
  # The no-device test skips on a GPU machine by design.
  expect_skips=0
  [[ "${t}" == *nodevice* ]] && expect_skips=1
  if [[ ${rc} -eq 124 ]]; then
    echo "FAIL ${t}: timed out after ${step_timeout} s (log ${log})"
    failed=$((failed + 1))
  elif [[ ${rc} -ne 0 ]]; then
    echo "FAIL ${t}: rc ${rc} (log ${log})"
    grep -E '^\[  FAILED  \]|Failure|Check failed|out of bound|differs' "${log}" | head -20 | sed 's/^/    /'
    failed=$((failed + 1))
  elif [[ ${skipped} -gt 0 && ${expect_skips} -eq 0 ]]; then
    # A skip means the test saw no device: nothing was checked.
    echo "FAIL ${t}: ${skipped} tests skipped, no CUDA device visible (log ${log})"
    grep -E 'no CUDA device' "${log}" | head -2 | sed 's/^/    /'
    failed=$((failed + 1))
  else
    echo "PASS ${t} (${ran} tests, ${skipped} skipped)"
    passed=$((passed + 1))
  fi
done

if ((sanitize)); then
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [[ -x "${sanitizer}" ]]; then
    for t in core/ops/cuda/registrations_test core/ops/cuda/gemm_test \
      core/ops/cuda/int8_test core/ops/cuda/index_check_loss_totals_test; do
      log="${logs}/$(basename "${t}").memcheck.log"
      timeout -k 5 "${step_timeout}" "${sanitizer}" --tool memcheck --error-exitcode 99 \
        "${bin}/${t}" >"${log}" 2>&1
      rc=$?
      if [[ ${rc} -eq 0 ]]; then
        echo "PASS memcheck ${t}"
        passed=$((passed + 1))
      else
        echo "FAIL memcheck ${t}: rc ${rc} (log ${log})"
        grep -E 'ERROR SUMMARY|Invalid|out of bounds' "${log}" | head -10 | sed 's/^/    /'
        failed=$((failed + 1))
      fi
    done
  else
    echo "memcheck: compute-sanitizer not available, not run"
  fi
fi

echo "CUDA OPS CHECK: ${passed} passed, ${failed} failed"
[[ ${failed} -eq 0 ]]
