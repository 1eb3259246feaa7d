#!/usr/bin/env bash
# End to end, in real processes: --pipeline-schedule zbv through the train
# binary. PP 2 with the V's two chunks per stage matches the serial run's
# losses within 1e-5 relative and logs ZB-V's stage timers; its checkpoint
# (global layer names) resumes under 1F1B at PP 2 and at PP 1, and a 1F1B
# checkpoint resumes under ZB-V, each continuing within 1e-6 of the
# uninterrupted run, also at PP 2 x DP 2 with the distributed optimizer and
# with ZeRO-3; the balanced split's first/last stage flags run under ZB-V
# too, and the planner's report names them; bad combinations fail before
# training, naming the flag.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
        --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 2 --eval-interval 10
        --log-interval 1 --train-iters 16 --lr-decay-iters 16
        --hidden-dropout 0.1 --num-threads 1)
zbv=(--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
     --pipeline-schedule zbv)

run serial 1
run zbv 2 "${zbv[@]}" --save "$work/zbv_ckpt" --save-interval 8
compare "$work/serial.jsonl" "$work/zbv.jsonl" 1e-5
grep -q "pipeline stage 1/2 (ZB-V): forward .* bubble measured" "$work/zbv.log" \
  || { echo "no ZB-V stage timers in the log"; cat "$work/zbv.log"; exit 1; }
run pp2 2 --pipeline-model-parallel-size 2 --save "$work/pp2_ckpt" --save-interval 8

# ZB-V's iteration-8 checkpoint under 1F1B (PP 2 and PP 1), and 1F1B's
# under ZB-V.
only_iteration_8() {  # from to
  mkdir -p "$2"
  cp -r "$1/iter_0000008" "$2/"
  echo 8 > "$2/latest_checkpointed_iteration.txt"
}
only_iteration_8 "$work/zbv_ckpt" "$work/zbv8"
only_iteration_8 "$work/pp2_ckpt" "$work/pp2_8"
run zbv_as_pp2 2 --pipeline-model-parallel-size 2 --load "$work/zbv8"
[[ "$(first_iteration "$work/zbv_as_pp2.jsonl")" == 9 ]]
compare "$work/zbv.jsonl" "$work/zbv_as_pp2.jsonl" 1e-6
run zbv_as_pp1 1 --load "$work/zbv8"
compare "$work/zbv.jsonl" "$work/zbv_as_pp1.jsonl" 1e-6
run pp2_as_zbv 2 "${zbv[@]}" --load "$work/pp2_8"
[[ "$(first_iteration "$work/pp2_as_zbv.jsonl")" == 9 ]]
compare "$work/pp2.jsonl" "$work/pp2_as_zbv.jsonl" 1e-6

# PP 2 x DP 2 with the state sharded (the distributed optimizer, ZeRO-3):
# stage 0's two copies of the tied embedding each save their own shards,
# and the checkpoint resumes under 1F1B.
for sharding in "--use-distributed-optimizer" \
    "--data-parallel-sharding-strategy optim_grads_params"; do
  # shellcheck disable=SC2086
  run zbv_dp2 4 "${zbv[@]}" $sharding --save "$work/dp2_ckpt" --save-interval 8
  rm -rf "$work/dp2_8"
  only_iteration_8 "$work/dp2_ckpt" "$work/dp2_8"
  # shellcheck disable=SC2086
  run zbv_dp2_as_pp2 4 --pipeline-model-parallel-size 2 $sharding --load "$work/dp2_8"
  compare "$work/zbv_dp2.jsonl" "$work/zbv_dp2_as_pp2.jsonl" 1e-6
  rm -rf "$work/dp2_ckpt"
done

# The balanced split's flags under ZB-V: 6 layers, 2 on stage 0 (one per
# chunk, beside the embedding and the output layer), 4 on stage 1.
run serial6 1 --num-layers 6
run zbv_uneven 2 --num-layers 6 --pipeline-model-parallel-size 2 \
  --pipeline-schedule zbv --decoder-first-pipeline-num-layers 2
compare "$work/serial6.jsonl" "$work/zbv_uneven.jsonl" 1e-5
grep -q "layers by stage 0-0+5-5 | 1-2+3-4" "$work/zbv_uneven.log" \
  || { echo "not the V's uneven split"; cat "$work/zbv_uneven.log"; exit 1; }

expect_error() {  # pattern flags...
  local pattern=$1
  shift
  if "$train" "${common[@]}" "$@" > "$work/bad.log" 2>&1; then
    echo "expected failure for $*"; exit 1
  fi
  grep -q -- "$pattern" "$work/bad.log" || { echo "want '$pattern':"; cat "$work/bad.log"; exit 1; }
}
export WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1
expect_error "--pipeline-schedule zbv runs two model chunks per stage" \
  --pipeline-model-parallel-size 2 --pipeline-schedule zbv
expect_error "--pipeline-schedule zbv runs two model chunks per stage" \
  --pipeline-model-parallel-size 2 --num-layers 8 \
  --num-layers-per-virtual-pipeline-stage 1 --pipeline-schedule zbv
expect_error "each stage needs an even count" --pipeline-model-parallel-size 2 \
  --pipeline-schedule zbv --decoder-first-pipeline-num-layers 1
expect_error "interleaved schedule) cannot be combined with" \
  --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
  --decoder-first-pipeline-num-layers 2
# The planner's report names ZB-V's balanced split (the output layer of a
# 16384-word vocabulary outweighs the layers on stage 0).
"$train" "${common[@]}" --vocab-size 16384 --num-layers 8 \
  --pipeline-model-parallel-size 2 --pipeline-schedule zbv \
  --num-layers-per-virtual-pipeline-stage 2 --dry-run > "$work/dry.txt" 2>&1
grep -q "balanced with --decoder-last-pipeline-num-layers 6 (each stage's" \
  "$work/dry.txt" || { cat "$work/dry.txt"; exit 1; }
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
echo "ZB-V end-to-end: parity, resharding and errors OK"
