#!/usr/bin/env bash
# GPT-2 124M training throughput on one GPU, from train's own metrics: 12
# layers, hidden 768, 12 heads, sequence 1024, vocabulary 50304, bf16, mock
# data, one micro-batch per step, the micro-batch as large as fits (tried in
# descending sizes; a size that runs out of device memory fails at its first
# allocation beyond the device, "out of memory on cuda:0", and the next
# smaller one is tried). Prints tokens/s, TFLOP/s, MFU and peak device
# memory beside the goal and the published peers, the loss's first and last
# step (a loss that is not a number fails), the planner's predicted step time
# and peak memory for the same run (train --dry-run) beside the measured
# ones, then one summary line:
#   GPT2 THROUGHPUT: ok (micro-batch 64: 412345 tokens/s, MFU 46.1% (goal 45%: met), peak memory 71.2 GiB)
#   GPT2 THROUGHPUT: skipped (no CUDA device)
#   GPT2 THROUGHPUT: FAILED (...)
#
#   tools/gpu/check_gpt2_throughput.sh [DIR] [BENCH_LOG]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle).
# MFU: train's FLOPs per step (Megatron's count: every GEMM, attention over
# the full sequence, the output layer; 3x forward) over the step time, set
# against the dense bf16 GEMM rate measured in the same run. train measures
# one (its "GEMM peak for MFU" line: the best bf16 4096^3 ops::Gemm, i.e.
# cuBLASLt, each timed to a one-row device-to-host read, so a little under
# the device's rate); //core/ops/cuda:bench another (BENCH_LOG, default
# DIR/logs/bench.log: "cuBLAS bf16 GEMM 4096^3", event-timed). The MFU
# reported is against the higher of the two, so it is never flattered by a
# low reference; both are printed.
# Time: THROUGHPUT_BUDGET (default 200 s) for all tries together, each try
# at most THROUGHPUT_RUN_TIMEOUT (default 120 s) and cut to
# GPU_CHECK_DEADLINE. THROUGHPUT_ITERS (default 12) steps per try, the
# first THROUGHPUT_WARMUP (default 3) untimed (cuBLASLt's algorithm search).
# THROUGHPUT_MICRO_BATCHES (default "128 64 32 16 8 4") and
# THROUGHPUT_MODEL_FLAGS (default: GPT-2 124M as above) exist for tests
# (tools/gpu/train_checks_test.sh runs a tiny model on the test device). Exit
# status: 0 ok or skipped, 1 failed (a figure below the goal is reported,
# not failed).
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"

bundle_paths "${1:-gpu_bundle}"
bench_log="${2:-${logs}/bench.log}"
budget="${THROUGHPUT_BUDGET:-200}"
run_limit="${THROUGHPUT_RUN_TIMEOUT:-120}"
iters="${THROUGHPUT_ITERS:-12}"
warmup="${THROUGHPUT_WARMUP:-3}"
read -r -a micro_batches <<<"${THROUGHPUT_MICRO_BATCHES:-128 64 32 16 8 4}"
read -r -a model <<<"${THROUGHPUT_MODEL_FLAGS:---num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --vocab-size 50304 --bf16}"
goal=45
deadline=$(($(date +%s) + budget))

if [[ ! -x "${train}" ]]; then
  echo "GPT2 THROUGHPUT: FAILED (missing ${train}; run tools/gpu/collect_libs.sh)"
  exit 1
fi

chosen="" result="" note=""
for mbs in "${micro_batches[@]}"; do
  left=$((deadline - $(date +%s)))
  limit="$(run_timeout "$((left < run_limit ? left : run_limit))")"
  if ((limit == 0)); then
    note="time budget spent before micro-batch ${mbs}"
    break
  fi
  name="gpt2_mbs${mbs}"
  rm -f "${logs}/${name}.jsonl"
  timeout -k 5 "${limit}" "${train}" "${model[@]}" --mock-data \
    --micro-batch-size "${mbs}" --global-batch-size "${mbs}" \
    --train-iters "${iters}" --lr-decay-iters "${iters}" --log-interval 1 \
    --eval-iters 0 --device "${check_device}" "${extra_flags[@]}" \
    --metrics-file "${logs}/${name}.jsonl" >"${logs}/${name}.log" 2>&1
  rc=$?
  if [[ ${rc} -eq 2 ]] && no_device "${logs}/${name}.log"; then
    echo "GPT2 THROUGHPUT: skipped (no CUDA device)"
    exit 0
  fi
  rate="$(mean_rate "${logs}/${name}.jsonl" "${warmup}")"
  if [[ ${rc} -eq 0 || (${rc} -eq 124 && -n "${rate}") ]]; then
    chosen="${mbs}" result="${rate}"
    ((rc == 124)) && note="timed out after ${limit} s; figures from the steps done"
    break
  fi
  if grep -qE 'out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED' \
    "${logs}/${name}.log"; then
    echo "micro-batch ${mbs}: out of device memory (rc=${rc}," \
      "$(grep -m1 -oE 'out of memory on [^ ]*|cudaErrorMemoryAllocation' \
        "${logs}/${name}.log")); trying a smaller one"
    continue
  fi
  if ((rc == 124)); then
    echo "micro-batch ${mbs}: no step timed within ${limit} s; trying a smaller one"
    continue
  fi
  tail -5 "${logs}/${name}.log"
  echo "GPT2 THROUGHPUT: FAILED (micro-batch ${mbs}: rc=${rc}; log ${logs}/${name}.log)"
  exit 1
done
if [[ -z "${chosen}" ]]; then
  echo "GPT2 THROUGHPUT: FAILED (no micro-batch of ${micro_batches[*]} ran${note:+: ${note}})"
  exit 1
fi

log="${logs}/gpt2_mbs${chosen}.log"
read -r tokens tflops peak_bytes timed <<<"${result}"
# The loss must be a number at every step (a NaN or inf means the figures
# time a broken run); whether it falls over these few steps is printed.
read -r first_loss last_loss bad_loss < <(losses "${logs}/gpt2_mbs${chosen}.jsonl" | awk '
  NR == 1 { f = $2 }
  { l = $2; if ($2 !~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/) bad++ }
  END { print (f == "" ? "none" : f), (l == "" ? "none" : l), bad + 0 }')
if [[ "${first_loss}" == none || ${bad_loss} -gt 0 ]]; then
  echo "GPT2 THROUGHPUT: FAILED (loss not finite: ${bad_loss} steps; first ${first_loss}, last ${last_loss}; log ${log})"
  exit 1
fi
echo "loss ${first_loss} -> ${last_loss} ($(awk -v a="${first_loss}" -v b="${last_loss}" \
  'BEGIN { print (b < a ? "falls" : "does not fall") }'))"
# The planner's prediction for the same run (train --dry-run: tools/plan's
# model), beside what was measured; the goal is within 10% of each.
plan_log="${logs}/gpt2_mbs${chosen}_plan.log"
timeout -k 5 60 "${train}" "${model[@]}" --mock-data --micro-batch-size "${chosen}" \
  --global-batch-size "${chosen}" --device "${check_device}" "${extra_flags[@]}" \
  --dry-run >"${plan_log}" 2>&1
plan_ms="$(awk '/^step time/ { s = 1 } s && $1 == "total" { print $2; exit }' "${plan_log}")"
plan_gib="$(awk '/^memory of/ { m = 1 } m && $1 == "total" { print $2; exit }' "${plan_log}")"
seq_len="$(printf '%s\n' "${model[@]}" "${extra_flags[@]}" |
  awk 'p { n = $1; p = 0 } $1 == "--seq-length" { p = 1 } END { print n }')"
awk -v pms="${plan_ms}" -v pgib="${plan_gib}" -v tok="${tokens}" \
  -v mbs="${chosen}" -v seq="${seq_len:-1024}" -v mem="${peak_bytes}" '
  BEGIN {
    if (pms == "" || pgib == "") { print "planner: no prediction (see the plan log)"; exit }
    ms = tok > 0 ? 1000 * mbs * seq / tok : 0
    gib = mem / 2^30
    dms = ms > 0 ? 100 * (pms - ms) / ms : 0
    dgib = gib > 0 ? 100 * (pgib - gib) / gib : 0
    printf "planner: step %.1f ms predicted, %.1f ms measured (%+.0f%%); peak memory %.2f GiB predicted, %.2f GiB measured (%+.0f%%)\n", pms, ms, dms, pgib, gib, dgib
  }'
# The reference GEMM rates, in TFLOP/s (0 when absent).
train_peak="$(sed -n 's/.*GEMM peak for MFU: \([0-9.]*\) GFLOP\/s.*/\1/p' "${log}" |
  head -1 | awk '{ printf "%.6g", $1 / 1e3 }')"
bench_peak="$(sed -n 's/.*cuBLAS bf16 GEMM 4096^3: \([0-9.]*\) TFLOP\/s.*/\1/p' \
  "${bench_log}" 2>/dev/null | head -1)"
total_mib=""
command -v nvidia-smi >/dev/null && total_mib="$(nvidia-smi -i 0 \
  --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)"
grep -h -m1 "device ${check_device}" "${log}" | sed 's/^.*\] //'
awk -v tok="${tokens}" -v tf="${tflops}" -v mem="${peak_bytes}" \
  -v n="${timed}" -v mbs="${chosen}" -v tp="${train_peak:-0}" \
  -v bp="${bench_peak:-0}" -v total="${total_mib:-0}" -v goal="${goal}" \
  -v note="${note}" '
  BEGIN {
    ref = tp > bp ? tp : bp
    mfu = ref > 0 ? 100 * tf / ref : -1
    met = mfu >= goal ? "met" : "not met"
    loud = mfu >= goal ? "met" : "NOT met"
    tp_text = tp > 0 ? sprintf("%.1f", tp) : "none"
    bp_text = bp > 0 ? sprintf("%.1f", bp) : "none"
    mfu_text = mfu >= 0 ? sprintf("%.1f%%", mfu) : "unknown"
    note_text = note != "" ? " (" note ")" : ""
    gib = mem / 2^30
    printf "GPT-2 124M, bf16, sequence 1024, micro-batch %d, %d timed steps%s:\n", mbs, n, note_text
    printf "  tokens/s        %.0f\n", tok
    printf "  model TFLOP/s   %.1f (Megatron FLOP count)\n", tf
    printf "  dense bf16 GEMM %s TFLOP/s measured by train (cuBLASLt 4096^3), %s by the bench (cuBLAS 4096^3)\n", tp_text, bp_text
    if (mfu >= 0) {
      printf "  MFU             %.1f%% against %.1f TFLOP/s", mfu, ref
      if (tp > 0 && bp > 0) {
        printf " (%.1f%% against train'\''s, %.1f%% against the bench'\''s)", 100 * tf / tp, 100 * tf / bp
      }
      printf "; goal %d%%: %s\n", goal, loud
    } else {
      printf "  MFU             unknown (no GEMM rate measured); goal %d%%\n", goal
    }
    printf "  peak memory     %.1f GiB", gib
    if (total > 0) printf " of %.1f GiB on the device", total / 1024
    printf "\n"
    printf "  peers: llm.c GPT-2 124M about 60%% MFU on A100; modded-nanogpt about 3.7M tokens/s on 8 H100 (about 460k per GPU); llm.c'\''s GPT-2 124M script: 8 A100 at about 300 ms per 524,288-token step (about 218k tokens/s per GPU)\n"
    printf "GPT2 THROUGHPUT: ok (micro-batch %d: %.0f tokens/s, MFU %s (goal %d%%: %s), peak memory %.1f GiB)\n", mbs, tok, mfu_text, goal, met, gib
  }'
