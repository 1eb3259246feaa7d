#!/usr/bin/env bash
# --cuda-graph on a GPU machine without Bazel: the tiny GPT (train's default
# model) for 20 steps of 8 micro-batches on --device cuda, without and with
# --cuda-graph (dropout off, which --cuda-graph requires), the flags
# otherwise identical. The losses must agree (the same kernels on the same
# data: expected bit for bit; a relative 1e-6 is allowed for kernels whose
# reduction order may vary from run to run), and the mean step time of both
# runs is printed, the figure issue 18 asks for. One line:
#   CUDA GRAPH: ok (20 steps, max relative difference 0; 152 replays; step 41.3 ms eager, 30.2 ms graphed)
#   CUDA GRAPH: skipped (no CUDA device)
#   CUDA GRAPH: FAILED (...)
#
#   tools/gpu/check_cuda_graph.sh [DIR]
#
# DIR is a bundle from tools/gpu/collect_libs.sh (default gpu_bundle), as
# for check_train_parity.sh. Logs go to DIR/logs/cuda_graph_{eager,graph}.log.
# Exit status: 0 ok or skipped, 1 failed. STEP_TIMEOUT (default 300 s)
# bounds each run.
set -uo pipefail

dir="${1:-gpu_bundle}"
bin="${dir}/bin"
[[ -d "${bin}" ]] || bin="${dir}"
train="${bin}/tools/train"
data="${dir}/data/default_corpus_text_document"
lib="${dir}/lib"
[[ -d "${lib}" ]] || lib="${dir}/../lib"
export LD_LIBRARY_PATH="$(cd "${lib}" 2>/dev/null && pwd):/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
logs="${dir}/logs"
mkdir -p "${logs}"
step_timeout="${STEP_TIMEOUT:-300}"

if [[ ! -x "${train}" ]]; then
  echo "CUDA GRAPH: FAILED (missing ${train}; run tools/gpu/collect_libs.sh)"
  exit 1
fi
flags=(--data-path "${data}" --data-cache-path "${logs}/cuda_graph_data_cache"
       --train-iters 20 --lr-decay-iters 20 --log-interval 1 --eval-iters 0
       --peak-tflops 1 --hidden-dropout 0 --attention-dropout 0
       --micro-batch-size 2 --global-batch-size 16 --device cuda)
for mode in eager graph; do
  extra=()
  [[ ${mode} == graph ]] && extra=(--cuda-graph)
  rm -f "${logs}/cuda_graph_${mode}.jsonl"
  timeout "${step_timeout}" "${train}" "${flags[@]}" "${extra[@]}" \
    --metrics-file "${logs}/cuda_graph_${mode}.jsonl" \
    >"${logs}/cuda_graph_${mode}.log" 2>&1
  rc=$?
  if [[ ${rc} -eq 2 ]] &&
    grep -q -- '--device cuda: no CUDA device' "${logs}/cuda_graph_${mode}.log"; then
    echo "CUDA GRAPH: skipped (no CUDA device)"
    exit 0
  fi
  if [[ ${rc} -ne 0 ]]; then
    echo "CUDA GRAPH: FAILED (${mode}: rc=${rc}; log ${logs}/cuda_graph_${mode}.log)"
    tail -5 "${logs}/cuda_graph_${mode}.log"
    exit 1
  fi
done

losses() {
  sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"
}
# Mean step time over iterations 3-20 (the first two hold the warm-up and
# the capture).
step_ms() {
  grep -o 'iteration *[0-9]*/ *[0-9]* |.*elapsed time per iteration (ms): [0-9.]*' "$1" |
    awk '{ it = $2 + 0; if (it > 2) { s += $NF; n++ } } END { if (n) printf "%.1f", s / n; else print "?" }'
}
replays=$(sed -n 's/.*cuda graph: \([0-9]*\) micro-batches replayed.*/\1/p' \
  "${logs}/cuda_graph_graph.log" | head -1)
eager_ms=$(step_ms "${logs}/cuda_graph_eager.log")
graph_ms=$(step_ms "${logs}/cuda_graph_graph.log")
awk -v replays="${replays:-0}" -v e="${eager_ms}" -v g="${graph_ms}" '
  NR == FNR { ref[$1] = $2; next }
  ($1 in ref) {
    d = ref[$1] - $2; if (d < 0) d = -d
    m = ref[$1] < 0 ? -ref[$1] : ref[$1]
    r = m > 0 ? d / m : d
    if (r > worst) worst = r
    n++
    if (r > 1e-6) { printf "  iteration %d: eager %s graph %s\n", $1, ref[$1], $2; bad++ }
  }
  END {
    if (n != 20) { printf "CUDA GRAPH: FAILED (%d common steps, not 20)\n", n; exit 1 }
    if (bad) { printf "CUDA GRAPH: FAILED (%d of 20 steps differ)\n", bad; exit 1 }
    if (replays + 0 < 100) { printf "CUDA GRAPH: FAILED (%d replays, want >= 100)\n", replays; exit 1 }
    printf "CUDA GRAPH: ok (20 steps, max relative difference %.2g; %d replays; step %s ms eager, %s ms graphed)\n", worst, replays, e, g
  }' <(losses "${logs}/cuda_graph_eager.jsonl") <(losses "${logs}/cuda_graph_graph.jsonl")
