#!/usr/bin/env bash
# End to end, in real processes: checkpoints move between pipeline
# schedules and pipeline sizes through the train binary (global layer
# names, so the schedule that wrote a checkpoint does not matter). ZB-H1 and
# interleaved 1F1B at PP 2 match the serial run within 1e-5; iteration 8 of
# each resumes under another schedule, each continuing within 1e-6 of the
# run that saved it: serial (PP 1) under ZB-V at PP 2, ZB-H1 under
# interleaved 1F1B and under ZB-V, interleaved 1F1B under ZB-H1 at PP 4.
# (ZB-V's own checkpoints under 1F1B at PP 2 and PP 1, also sharded over
# DP 2, are in train_zbv_e2e_test.)
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
        --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 0 --log-interval 1
        --train-iters 12 --lr-decay-iters 12
        --hidden-dropout 0.1 --num-threads 1)
zbh1=(--pipeline-model-parallel-size 2 --pipeline-schedule zb-h1)
interleaved=(--pipeline-model-parallel-size 2
             --num-layers-per-virtual-pipeline-stage 1)
zbv=(--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
     --pipeline-schedule zbv)

# A copy of DIR's iteration-8 checkpoint alone, so a load resumes there.
only_iteration_8() {  # from to
  mkdir -p "$2"
  cp -r "$1/iter_0000008" "$2/"
  echo 8 > "$2/latest_checkpointed_iteration.txt"
}
# resume NAME NPROC FROM REF FLAGS...: loads FROM's iteration 8 under FLAGS
# and compares iterations 9-12 with the run REF that saved it.
resume() {
  local name=$1 nproc=$2 from=$3 ref=$4
  shift 4
  only_iteration_8 "$work/${from}_ckpt" "$work/${name}_load"
  run "$name" "$nproc" "$@" --load "$work/${name}_load"
  [[ "$(first_iteration "$work/$name.jsonl")" == 9 ]] \
    || { echo "$name did not resume at iteration 9"; exit 1; }
  compare "$work/$ref.jsonl" "$work/$name.jsonl" 1e-6
  echo "$name: within 1e-6 of $ref (worst $(worst "$work/$ref.jsonl" "$work/$name.jsonl"))"
}

run serial 1 --save "$work/serial_ckpt" --save-interval 8
run zbh1 2 "${zbh1[@]}" --save "$work/zbh1_ckpt" --save-interval 8
compare "$work/serial.jsonl" "$work/zbh1.jsonl" 1e-5
grep -q "(ZB-H1)" "$work/zbh1.log" || { echo "not ZB-H1"; cat "$work/zbh1.log"; exit 1; }
run interleaved 2 "${interleaved[@]}" --save "$work/interleaved_ckpt" --save-interval 8
compare "$work/serial.jsonl" "$work/interleaved.jsonl" 1e-5

resume serial_as_zbv 2 serial serial "${zbv[@]}"
resume zbh1_as_interleaved 2 zbh1 zbh1 "${interleaved[@]}"
resume zbh1_as_zbv 2 zbh1 zbh1 "${zbv[@]}"
resume interleaved_as_zbh1_pp4 4 interleaved interleaved \
  --pipeline-model-parallel-size 4 --pipeline-schedule zb-h1
echo "pipeline schedules: checkpoints resharded between schedules OK"
