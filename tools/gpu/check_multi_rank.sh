#!/usr/bin/env bash
# The multi-GPU section, for a machine with two GPUs or more (one GPU cannot
# host two NCCL ranks): the tiny GPT (train's default model on the carried
# corpus) for 20 fp32 steps, TF32 off, one GPU against tools/launch with 2
# processes at TP 2 + SP, PP 2 and DP 2 + ZeRO-1 (--use-distributed-
# optimizer); every step's loss within 1e-5 (relative: the serial-parallel
# bound the CPU tests hold, reduction order over 20 steps). Then DP scaling
# on a bigger model (GPT-2 124M, bf16, micro-batch 16, mock data): DP 2's
# tokens/s over twice one GPU's, the global batch growing with DP (weak
# scaling). Prints a line per layout and one summary line:
#   MULTI-RANK tp2_sp: ok (20 steps, max relative difference 2.1e-07; tolerance 1e-5)
#   DP scaling efficiency: 93.4% (DP 2: 801234 tokens/s; one GPU: 428811 tokens/s)
#   MULTI-RANK: ok (tp2_sp pp2 dp2_zero1; DP scaling 93.4%)
#   MULTI-RANK: skipped (1 GPU)
#   MULTI-RANK: FAILED (...)
#
#   tools/gpu/check_multi_rank.sh [DIR]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle:
# DIR/bin/tools/{train,launch}, DIR/data). Logs go to DIR/logs/mr_*.
# MULTI_RANK_LAYOUTS (default "tp2_sp pp2 dp2_zero1"), MULTI_RANK_STEPS
# (default 20), SCALING_MODEL_FLAGS (default: GPT-2 124M, bf16, micro-batch
# 16) and SCALING_ITERS (default 10, the first 3 untimed) exist for tests
# (tools/gpu/train_checks_test.sh runs them on the test device); SCALING_ITERS=0
# skips the scaling figure. tools/gpu/check_lib.sh lists the variables every
# check shares. Exit status: 0 ok or skipped, 1 failed.
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"

bundle_paths "${1:-gpu_bundle}"
step_timeout="${STEP_TIMEOUT:-300}"
steps="${MULTI_RANK_STEPS:-20}"
read -r -a layouts <<<"${MULTI_RANK_LAYOUTS:-tp2_sp pp2 dp2_zero1}"
scaling_iters="${SCALING_ITERS:-10}"
read -r -a scaling_model <<<"${SCALING_MODEL_FLAGS:---num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --vocab-size 50304 --bf16 --micro-batch-size 16}"
tolerance=1e-5

gpus="$(gpu_count)"
if ((gpus < 2)); then
  echo "MULTI-RANK: skipped (${gpus} GPU$([[ ${gpus} == 1 ]] || echo s))"
  exit 0
fi
for exe in "${train}" "${launch}"; do
  if [[ ! -x "${exe}" ]]; then
    echo "MULTI-RANK: FAILED (missing ${exe}; run tools/gpu/collect_libs.sh)"
    exit 1
  fi
done
if [[ ! -f "${data}.bin" || ! -f "${data}.idx" ]]; then
  echo "MULTI-RANK: FAILED (missing ${data}.{bin,idx}; collect_libs.sh writes them)"
  exit 1
fi

# go NAME NPROC FLAGS...: train on the device under test, NPROC processes
# (tools/launch when more than one), writing DIR/logs/mr_NAME.{log,jsonl}.
go() {
  local name="mr_$1" nproc="$2" limit rc
  shift 2
  limit="$(run_timeout "${step_timeout}")"
  if ((limit == 0)); then
    echo "MULTI-RANK: FAILED (no time left for $name)"
    exit 1
  fi
  local cmd=("${train}" --device "${check_device}" "${extra_flags[@]}" "$@"
             --metrics-file "${logs}/${name}.jsonl")
  ((nproc > 1)) && cmd=("${launch}" --nproc_per_node "${nproc}" -- "${cmd[@]}")
  rm -f "${logs}/${name}.jsonl"
  timeout -k 5 "${limit}" "${cmd[@]}" >"${logs}/${name}.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    tail -5 "${logs}/${name}.log"
    echo "MULTI-RANK: FAILED (${name#mr_}: rc=${rc}" \
      "$( ((rc == 124)) && echo "(timed out after ${limit} s)");" \
      "log ${logs}/${name}.log)"
    exit 1
  fi
}

export NVIDIA_TF32_OVERRIDE=0
tiny=(--data-path "${data}" --data-cache-path "${logs}/train_data_cache"
      --train-iters "${steps}" --lr-decay-iters "${steps}" --log-interval 1
      --eval-iters 0 --peak-tflops 1 --micro-batch-size 4
      --global-batch-size 16)
go serial 1 "${tiny[@]}"
grep -h -m1 "device ${check_device}" "${logs}/mr_serial.log" | sed 's/^.*\] //'
passed=()
for layout in "${layouts[@]}"; do
  case "${layout}" in
    tp2_sp) flags=(--tensor-model-parallel-size 2 --sequence-parallel) ;;
    pp2) flags=(--pipeline-model-parallel-size 2) ;;
    dp2_zero1) flags=(--use-distributed-optimizer) ;;
    *) echo "MULTI-RANK: FAILED (MULTI_RANK_LAYOUTS: unknown '${layout}')"
       exit 1 ;;
  esac
  go "${layout}" 2 "${tiny[@]}" "${flags[@]}" "${candidate_flags[@]}"
  compare_losses "${logs}/mr_serial.jsonl" "${logs}/mr_${layout}.jsonl" \
    "${tolerance}" "${steps}" "MULTI-RANK ${layout}" || {
    echo "MULTI-RANK: FAILED (${layout} differs from one GPU beyond ${tolerance})"
    exit 1
  }
  passed+=("${layout}")
done

scaling=""
if ((scaling_iters > 0)); then
  # The micro-batch the model flags name (train's default 8), for the
  # global batches.
  mbs=8
  for ((i = 0; i < ${#scaling_model[@]}; i++)); do
    [[ ${scaling_model[i]} == --micro-batch-size ]] && mbs="${scaling_model[i + 1]}"
  done
  unset NVIDIA_TF32_OVERRIDE
  common=("${scaling_model[@]}" --mock-data --train-iters "${scaling_iters}"
          --lr-decay-iters "${scaling_iters}" --log-interval 1 --eval-iters 0 --peak-tflops 1)
  go scaling_1 1 "${common[@]}" --global-batch-size "${mbs}"
  go scaling_dp2 2 "${common[@]}" --global-batch-size "$((2 * mbs))"
  one="$(mean_rate "${logs}/mr_scaling_1.jsonl" 3 | cut -d' ' -f1)"
  two="$(mean_rate "${logs}/mr_scaling_dp2.jsonl" 3 | cut -d' ' -f1)"
  if [[ -z "${one}" || -z "${two}" ]]; then
    echo "MULTI-RANK: FAILED (DP scaling: no timed steps; SCALING_ITERS must exceed 3)"
    exit 1
  fi
  scaling="$(awk -v one="${one}" -v two="${two}" \
    'BEGIN { printf "%.1f%%", 100 * two / (2 * one) }')"
  echo "DP scaling efficiency: ${scaling} (DP 2: $(printf '%.0f' "${two}")" \
    "tokens/s; one GPU: $(printf '%.0f' "${one}") tokens/s; micro-batch" \
    "${mbs} per GPU; ideal 100%)"
fi
echo "MULTI-RANK: ok (${passed[*]}${scaling:+; DP scaling ${scaling}})"
