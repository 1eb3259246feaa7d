#!/usr/bin/env bash
# End to end, in real processes: context parallelism through the train
# binary. CP 2 (ring attention, with the distributed optimizer sharded over
# DP x CP) and CP 2 with --cp-comm-type a2a match the serial run's losses
# within 1e-5 relative; the CP 2 checkpoint of iteration 6 resumes at CP 1
# and at CP 4 and its losses continue within 1e-6 of the uninterrupted CP 2
# run (CP shards no parameter, so only the layout metadata changes); bad
# sizes fail before training with the flag named.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 256 --num-layers 2 --hidden-size 32
        --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
        --global-batch-size 4 --eval-iters 1 --eval-interval 100
        --log-interval 1 --train-iters 12 --lr-decay-iters 12
        --position-embedding-type rope --num-threads 1)

run serial 1
run cp2 2 --context-parallel-size 2 --use-distributed-optimizer \
  --save "$work/ckpt" --save-interval 6
compare "$work/serial.jsonl" "$work/cp2.jsonl" 1e-5
grep -q "context parallelism: each sequence in 4 chunks over 2 ranks" "$work/cp2.log" \
  || { echo "no CP line in the CP 2 log"; cat "$work/cp2.log"; exit 1; }

run cp2_a2a 2 --context-parallel-size 2 --cp-comm-type a2a
compare "$work/serial.jsonl" "$work/cp2_a2a.jsonl" 1e-5

# Resharding: the CP 2 checkpoint of iteration 6 at CP 1 and CP 4.
mkdir -p "$work/ckpt6"
cp -r "$work/ckpt/iter_0000006" "$work/ckpt6/"
echo 6 > "$work/ckpt6/latest_checkpointed_iteration.txt"
run resumed_cp1 1 --load "$work/ckpt6" --use-distributed-optimizer
[[ "$(first_iteration "$work/resumed_cp1.jsonl")" == 7 ]]
compare "$work/cp2.jsonl" "$work/resumed_cp1.jsonl" 1e-6
run resumed_cp4 4 --context-parallel-size 4 --use-distributed-optimizer \
  --load "$work/ckpt6"
[[ "$(first_iteration "$work/resumed_cp4.jsonl")" == 7 ]]
compare "$work/cp2.jsonl" "$work/resumed_cp4.jsonl" 1e-6

# Bad input: one clear message, before any training.
expect_error() {  # pattern flags...
  local pattern=$1
  shift
  if "$train" "${common[@]}" "$@" > "$work/bad.log" 2>&1; then
    echo "expected failure for $*"; exit 1
  fi
  grep -q -- "$pattern" "$work/bad.log" || { echo "want '$pattern':"; cat "$work/bad.log"; exit 1; }
}
export WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1
expect_error "must divide into 2 x --context-parallel-size = 4" \
  --context-parallel-size 2 --seq-length 30
expect_error "--cp-comm-type: 'ring' is not p2p or a2a" \
  --context-parallel-size 2 --cp-comm-type ring
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
echo "context-parallel end-to-end: parity, resharding and errors OK"
