#!/usr/bin/env bash
# The train binary's one-GPU parity check, on a GPU machine without Bazel:
# the tiny GPT (train's default model: 4 layers, hidden 128, sequence 128)
# for 20 steps with --device cuda and with --device cpu, the flags otherwise
# identical, in fp32 with TF32 off (every step's loss within 1e-4, relative:
# fp32 reduction order over 20 steps) and in bf16 (within 2%: bf16's 8-bit
# mantissa, rounded differently by cuBLASLt and the CPU's GEMMs). Prints a
# line per precision, then one summary line:
#   TRAIN PARITY fp32: ok (20 steps, max relative difference 3.1e-07; tolerance 1e-4)
#   TRAIN PARITY bf16: ok (20 steps, max relative difference 4.2e-03; tolerance 2e-2)
#   TRAIN PARITY: ok (fp32, bf16)
#   TRAIN PARITY: skipped (no CUDA device)
#   TRAIN PARITY: FAILED (...)
#
#   tools/gpu/check_train_parity.sh [DIR]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle):
# DIR/bin/tools/train and the default corpus it carries in DIR/data (the
# GPU machine need not have the Debian packages the corpus comes from).
# Logs go to DIR/logs/parity_{fp32,bf16}_{device,cpu}.{log,jsonl}. Exit
# status: 0 ok or skipped, 1 failed. PARITY_PRECISIONS (default "fp32 bf16")
# and PARITY_STEPS (default 20) narrow the check, PARITY_MODEL_FLAGS
# replaces the tiny model (run_checks.sh: GPT-2 124M at sequence 1024) and
# PARITY_NAME (default parity) names its logs; tools/gpu/check_lib.sh
# lists the variables every check shares (GPU_CHECK_DEVICE=test with
# //tools:train_testdev, or cpu, runs the same comparison without a GPU:
# tools/gpu/train_checks_test.sh).
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"

bundle_paths "${1:-gpu_bundle}"
step_timeout="${STEP_TIMEOUT:-300}"
steps="${PARITY_STEPS:-20}"
read -r -a precisions <<<"${PARITY_PRECISIONS:-fp32 bf16}"

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
read -r -a model_flags <<<"${PARITY_MODEL_FLAGS:-}"
prefix="${PARITY_NAME:-parity}"
flags=(--data-path "${data}" --data-cache-path "${logs}/train_data_cache"
       --train-iters "${steps}" --lr-decay-iters "${steps}" --log-interval 1
       --eval-iters 0 --peak-tflops 1 "${model_flags[@]}" "${extra_flags[@]}")
summary=()
for precision in "${precisions[@]}"; do
  case "${precision}" in
    fp32) tolerance=1e-4 precision_flags=() ;;
    bf16) tolerance=2e-2 precision_flags=(--bf16) ;;
    *) echo "TRAIN PARITY: FAILED (PARITY_PRECISIONS: unknown '${precision}')"
       exit 1 ;;
  esac
  # The device under test first: its refusal without a GPU skips the rest.
  for role in device cpu; do
    name="${prefix}_${precision}_${role}"
    device=cpu extra=()
    [[ ${role} == device ]] && device="${check_device}" extra=("${candidate_flags[@]}")
    limit="$(run_timeout "${step_timeout}")"
    if ((limit == 0)); then
      echo "TRAIN PARITY: FAILED (no time left for ${precision} on ${device})"
      exit 1
    fi
    # --metrics-file appends: start each run's file afresh.
    rm -f "${logs}/${name}.jsonl"
    timeout -k 5 "${limit}" "${train}" "${flags[@]}" "${precision_flags[@]}" \
      --device "${device}" "${extra[@]}" \
      --metrics-file "${logs}/${name}.jsonl" >"${logs}/${name}.log" 2>&1
    rc=$?
    if [[ ${role} == device && ${rc} -eq 2 ]] &&
      no_device "${logs}/${name}.log"; then
      echo "TRAIN PARITY: skipped (no CUDA device)"
      exit 0
    fi
    if [[ ${rc} -ne 0 ]]; then
      tail -5 "${logs}/${name}.log"
      echo "TRAIN PARITY: FAILED (${precision} --device ${device}: rc=${rc}" \
        "$([[ ${rc} -eq 124 ]] && echo "(timed out after ${limit} s)");" \
        "log ${logs}/${name}.log)"
      exit 1
    fi
  done
  grep -h -m1 "device ${check_device}" "${logs}/${prefix}_${precision}_device.log" |
    sed 's/^.*\] //'
  compare_losses "${logs}/${prefix}_${precision}_cpu.jsonl" \
    "${logs}/${prefix}_${precision}_device.jsonl" "${tolerance}" "${steps}" \
    "TRAIN PARITY ${precision}" || {
    echo "TRAIN PARITY: FAILED (${precision}: ${check_device} differs from cpu" \
      "beyond ${tolerance})"
    exit 1
  }
  summary+=("${precision}")
done
echo "TRAIN PARITY: ok (${summary[*]}; ${steps} steps, ${check_device} against cpu)"
