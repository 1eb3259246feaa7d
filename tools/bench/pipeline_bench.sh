#!/usr/bin/env bash
# Pipeline parallelism on this machine: the same model and global batch
# trained without pipelining (one process) and under 1F1B and interleaved
# 1F1B at PP 2 (and PP 4, oversubscribed on 2 cores), in one run. Prints
# tokens/s against the unpipelined run and each stage's measured bubble
# beside the schedule's theoretical one.
#   tools/bazel run //tools/bench:pipeline -- [--iters N]
set -euo pipefail
launch=$1
train=$2
shift 2
iters=8
[[ "${1:-}" == "--iters" ]] && iters=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
model=(--mock-data --vocab-size 4096 --make-vocab-size-divisible-by 1
       --num-layers 8 --hidden-size 256 --num-attention-heads 8
       --seq-length 256 --micro-batch-size 2 --global-batch-size 16
       --eval-iters 0 --train-iters "$iters" --log-interval $((iters / 2)))

run() {  # name nproc flags...
  local name=$1 nproc=$2
  shift 2
  local threads=$(( cores / nproc > 0 ? cores / nproc : 1 ))
  if [[ $nproc == 1 ]]; then
    "$train" "${model[@]}" --num-threads "$threads" "$@" > "$work/$name.log" 2>&1
  else
    "$launch" --nproc_per_node "$nproc" -- "$train" "${model[@]}" \
      --num-threads "$threads" "$@" > "$work/$name.log" 2>&1
  fi || { cat "$work/$name.log"; exit 1; }
  # tokens/s of the last logged window (steady state).
  grep -o "tokens/s: [0-9.]*" "$work/$name.log" | tail -1 | awk '{print $2}'
}

printf "%-34s %10s %8s\n" "layout (global batch 16, m = 8)" "tokens/s" "vs PP 1"
base=$(run pp1 1)
printf "%-34s %10s %8s\n" "PP 1 (no pipelining, $cores threads)" "$base" "1.00"
for spec in "pp2 2 1F1B --pipeline-model-parallel-size 2" \
            "pp2_interleaved 2 interleaved(V=2) --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2" \
            "pp4 4 1F1B --pipeline-model-parallel-size 4"; do
  read -r name nproc label flags <<< "$spec"
  # shellcheck disable=SC2086
  tps=$(run "$name" "$nproc" $flags)
  printf "%-34s %10s %8.2f\n" "PP $nproc $label" "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN { print a / b }')"
  grep "pipeline stage" "$work/$name.log" | tail -n "$nproc" | sed 's/.*pipeline stage/    stage/'
done
