#!/usr/bin/env bash
# --cuda-graph end to end on the test device (whose graph capture records
# kernels instead of running them, as CUDA does): train_testdev --device
# test with --cuda-graph gives the losses of the same run without it,
# exactly, serially and over DP 2, with most micro-batches replayed; the
# step time of both runs is printed. Layouts it cannot cover are refused
# naming --cuda-graph, and so is the CPU device.
set -euo pipefail
abs() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
launch=$(abs "$1")
train_dev=$(abs "$2")
train=$(abs "$3")
source "$4"
work=${TEST_TMPDIR:-$(mktemp -d)}
cd "$work"
# Four micro-batches per step (global 16 = micro 4 x accumulation 4).
common=(--train-iters 6 --lr-decay-iters 6 --log-interval 1 --num-threads 1
        --eval-iters 1 --eval-interval 3 --peak-tflops 1
        --hidden-dropout 0 --attention-dropout 0
        --micro-batch-size 4 --global-batch-size 16)

# go NAME NPROC FLAGS...: trains on the test device, writing NAME.jsonl and
# NAME.log.
go() {
  local name=$1 nproc=$2
  shift 2
  local cmd=("$train_dev" --device test "${common[@]}" "$@"
             --metrics-file "$work/$name.jsonl")
  if [[ $nproc -gt 1 ]]; then
    cmd=("$launch" --nproc_per_node "$nproc" -- "${cmd[@]}")
  fi
  "${cmd[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}

# Mean iteration time of a run's log lines (ms), for the report.
step_ms() {
  grep -o 'elapsed time per iteration (ms): [0-9.]*' "$work/$1.log" \
    | awk '{ s += $NF; n++ } END { if (n) printf "%.1f", s / n; else print "?" }'
}

same() {
  local name=$1 nproc=$2
  shift 2
  go "${name}_eager" "$nproc" "$@"
  go "${name}_graph" "$nproc" --cuda-graph "$@"
  [[ $(losses "$work/${name}_graph.jsonl" | wc -l) == 6 ]] \
    || { echo "$name: not 6 loss lines"; cat "$work/${name}_graph.log"; exit 1; }
  diff <(losses "$work/${name}_eager.jsonl") <(losses "$work/${name}_graph.jsonl") \
    || { echo "$name: --cuda-graph changed the losses"; exit 1; }
  diff <(grep -ho 'validation loss[^|]*' "$work/${name}_eager.log") \
    <(grep -ho 'validation loss[^|]*' "$work/${name}_graph.log") \
    || { echo "$name: --cuda-graph changed the validation losses"; exit 1; }
  local replayed
  replayed=$(sed -n 's/.*cuda graph: \([0-9]*\) micro-batches replayed.*/\1/p' \
    "$work/${name}_graph.log" | head -1)
  # 6 steps x 4 micro-batches per rank (DP 2: 2 per rank): all but the
  # warm-up and the capture are replays.
  local want=$(( 6 * 4 / nproc - 2 ))
  [[ "${replayed:-0}" -ge "$want" ]] \
    || { echo "$name: ${replayed:-no} replays, want >= $want"; cat "$work/${name}_graph.log"; exit 1; }
  echo "$name: --cuda-graph = eager ($replayed micro-batches replayed);" \
    "step time $(step_ms "${name}_eager") ms eager, $(step_ms "${name}_graph") ms with --cuda-graph (test device)"
}

same serial 1
same dp2 2

# refused NAME PATTERN COMMAND...: fails, saying PATTERN.
refused() {
  local name=$1 pattern=$2
  shift 2
  if "$@" > "$work/$name.log" 2>&1; then
    echo "$name: was not refused"; cat "$work/$name.log"; exit 1
  fi
  grep -q -- "$pattern" "$work/$name.log" \
    || { echo "$name: no '$pattern' in:"; cat "$work/$name.log"; exit 1; }
  echo "$name: refused"
}
refused cpu '--cuda-graph' "$train" --device cpu --cuda-graph "${common[@]}"
refused dropout '--cuda-graph: dropout' \
  "$train_dev" --device test --cuda-graph "${common[@]}" --hidden-dropout 0.1
refused tp2 '--cuda-graph: tensor parallelism' \
  "$launch" --nproc_per_node 2 -- "$train_dev" --device test --cuda-graph \
  "${common[@]}" --tensor-model-parallel-size 2
refused overlap '--cuda-graph cannot be combined with --overlap-grad-reduce' \
  "$launch" --nproc_per_node 2 -- "$train_dev" --device test --cuda-graph \
  "${common[@]}" --overlap-grad-reduce
