#!/usr/bin/env bash
# End to end, in real processes: pipeline parallelism through the train
# binary. PP 2 (1F1B), PP 2 with two virtual stages (interleaved), PP 4 and
# PP 2 x TP 2 (SP) match the serial run's losses within 1e-5 relative; a
# checkpoint saved at PP 2 resumes at PP 1 and at PP 4 and its losses
# continue within 1e-6 of an uninterrupted PP 2 run; each stage logs its
# timers and bubble; bad splits fail before training with the flag named.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
        --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 2 --eval-interval 10
        --log-interval 1 --train-iters 20 --lr-decay-iters 20
        --hidden-dropout 0.1 --num-threads 1)

run serial 1
run pp2 2 --pipeline-model-parallel-size 2 --save "$work/ckpt" --save-interval 10
compare "$work/serial.jsonl" "$work/pp2.jsonl" 1e-5
grep -q "pipeline stage 1/2 (1F1B): forward .* bubble measured .*, theoretical 0.200" "$work/pp2.log" \
  || { echo "no per-stage timers in the PP 2 log"; cat "$work/pp2.log"; exit 1; }
grep -q "validation loss at iteration 10" "$work/pp2.log"

run pp2_interleaved 2 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
compare "$work/serial.jsonl" "$work/pp2_interleaved.jsonl" 1e-5
grep -q "(interleaved 1F1B).*theoretical 0.100" "$work/pp2_interleaved.log"

run pp4 4 --pipeline-model-parallel-size 4 --no-overlap-p2p-communication
compare "$work/serial.jsonl" "$work/pp4.jsonl" 1e-5

run pp2_tp2 4 --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 \
  --sequence-parallel
compare "$work/serial.jsonl" "$work/pp2_tp2.jsonl" 1e-5

# Resharding: the PP 2 checkpoint of iteration 10 at PP 1 and PP 4.
mkdir -p "$work/ckpt10"
cp -r "$work/ckpt/iter_0000010" "$work/ckpt10/"
echo 10 > "$work/ckpt10/latest_checkpointed_iteration.txt"
run resumed_pp1 1 --load "$work/ckpt10"
[[ "$(first_iteration "$work/resumed_pp1.jsonl")" == 11 ]]
compare "$work/pp2.jsonl" "$work/resumed_pp1.jsonl" 1e-6
run resumed_pp4 4 --pipeline-model-parallel-size 4 --load "$work/ckpt10"
compare "$work/pp2.jsonl" "$work/resumed_pp4.jsonl" 1e-6

# Bad input: one clear message, before any training.
expect_error() {  # pattern flags...
  local pattern=$1
  shift
  if "$train" "${common[@]}" "$@" > "$work/bad.log" 2>&1; then
    echo "expected failure for $*"; exit 1
  fi
  grep -q -- "$pattern" "$work/bad.log" || { echo "want '$pattern':"; cat "$work/bad.log"; exit 1; }
}
# As rank 0 of 2 would see it; the checks run before joining the world.
export WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1
expect_error "--num-layers 3 is not divisible by --pipeline-model-parallel-size 2" \
  --num-layers 3 --pipeline-model-parallel-size 2
expect_error "multiple of --pipeline-model-parallel-size 2" \
  --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
  --global-batch-size 6
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
echo "pipeline end-to-end: parity, resharding and errors OK"
