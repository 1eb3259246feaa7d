#!/usr/bin/env bash
# --cuda-graph on a GPU machine without Bazel: the tiny GPT (train's default
# model) for 20 steps of 8 micro-batches on --device cuda, without and with
# --cuda-graph (dropout off, which --cuda-graph requires), the flags
# otherwise identical. The losses must agree (the same kernels on the same
# data: expected bit for bit; a relative 1e-6 is allowed for kernels whose
# reduction order may vary from run to run), and the mean step time of both
# runs is printed, the figure issue 18 asks for. The loss comparison's line
# (check_lib.sh's compare_losses), then one summary line:
#   CUDA GRAPH losses: ok (20 steps, max relative difference 0; tolerance 1e-6)
#   CUDA GRAPH: ok (20 steps; 158 replays; step 41.3 ms eager, 30.2 ms graphed)
#   CUDA GRAPH: skipped (no CUDA device)
#   CUDA GRAPH: FAILED (...)
#
#   tools/gpu/check_cuda_graph.sh [DIR]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle), as
# for check_train_parity.sh. Logs go to DIR/logs/cuda_graph_{eager,graph}.log.
# Exit status: 0 ok or skipped, 1 failed. CUDA_GRAPH_STEPS (default 20)
# narrows it for tests; tools/gpu/check_lib.sh lists the variables every
# check shares (GPU_CHECK_DEVICE=test with //tools:train_testdev runs it
# without a GPU: tools/gpu/train_checks_test.sh).
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"

bundle_paths "${1:-gpu_bundle}"
step_timeout="${STEP_TIMEOUT:-300}"
steps="${CUDA_GRAPH_STEPS:-20}"
# 8 micro-batches a step; the first is eager and the second captured.
min_replays=$((steps * 5))

if [[ ! -x "${train}" ]]; then
  echo "CUDA GRAPH: FAILED (missing ${train}; run tools/gpu/collect_libs.sh)"
  exit 1
fi
flags=(--data-path "${data}" --data-cache-path "${logs}/cuda_graph_data_cache"
       --train-iters "${steps}" --lr-decay-iters "${steps}" --log-interval 1
       --eval-iters 0 --peak-tflops 1 --hidden-dropout 0 --attention-dropout 0
       --micro-batch-size 2 --global-batch-size 16 --device "${check_device}"
       "${extra_flags[@]}")
for mode in eager graph; do
  extra=()
  [[ ${mode} == graph ]] && extra=(--cuda-graph "${candidate_flags[@]}")
  rm -f "${logs}/cuda_graph_${mode}.jsonl"
  t="$(run_timeout "${step_timeout}")"
  if ((t == 0)); then
    echo "CUDA GRAPH: FAILED (no time left for the ${mode} run)"
    exit 1
  fi
  timeout -k 5 "${t}" "${train}" "${flags[@]}" "${extra[@]}" \
    --metrics-file "${logs}/cuda_graph_${mode}.jsonl" \
    >"${logs}/cuda_graph_${mode}.log" 2>&1
  rc=$?
  if [[ ${rc} -eq 2 ]] && no_device "${logs}/cuda_graph_${mode}.log"; then
    echo "CUDA GRAPH: skipped (no CUDA device)"
    exit 0
  fi
  if [[ ${rc} -ne 0 ]]; then
    echo "CUDA GRAPH: FAILED (${mode}: rc=${rc}; log ${logs}/cuda_graph_${mode}.log)"
    tail -5 "${logs}/cuda_graph_${mode}.log"
    exit 1
  fi
done

# Mean step time over iterations 3 on (the first two hold the warm-up and
# the capture).
step_ms() {
  grep -o 'iteration *[0-9]*/ *[0-9]* |.*elapsed time per iteration (ms): [0-9.]*' "$1" |
    awk '{ it = $2 + 0; if (it > 2) { s += $NF; n++ } } END { if (n) printf "%.1f", s / n; else print "?" }'
}
replays=$(sed -n 's/.*cuda graph: \([0-9]*\) micro-batches replayed.*/\1/p' \
  "${logs}/cuda_graph_graph.log" | head -1)
replays="${replays:-0}"
# The same kernels on the same data: expected bit for bit; a relative 1e-6
# allows kernels whose reduction order may vary from run to run.
if ! compare_losses "${logs}/cuda_graph_eager.jsonl" \
  "${logs}/cuda_graph_graph.jsonl" 1e-6 "${steps}" "CUDA GRAPH losses"; then
  echo "CUDA GRAPH: FAILED (graphed losses differ from eager beyond 1e-6)"
  exit 1
fi
if ((replays < min_replays)); then
  echo "CUDA GRAPH: FAILED (${replays} replays, want >= ${min_replays})"
  exit 1
fi
echo "CUDA GRAPH: ok (${steps} steps; ${replays} replays; step" \
  "$(step_ms "${logs}/cuda_graph_eager.log") ms eager," \
  "$(step_ms "${logs}/cuda_graph_graph.log") ms graphed)"
