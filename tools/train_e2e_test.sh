#!/usr/bin/env bash
# End to end, in real processes: a 4-process run (TP 2 with sequence
# parallelism, DP 2) matches the serial run's losses within 1e-5 relative,
# saves, and resumes under TP 1, DP 4 with the distributed optimizer (its
# parameter all-gathers overlapped with the forward),
# continuing to match. Resumed in the same layout (4 processes, and one) the
# losses are bit-identical to an uninterrupted run.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 512 --num-layers 2 --hidden-size 64
        --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 0 --log-interval 1
        --train-iters 20 --lr-decay-iters 20 --num-threads 1)

run serial 1

"$launch" --nproc_per_node 4 -- "$train" "${common[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel --train-iters 10 \
  --save "$work/ckpt" --metrics-file "$work/tp2dp2.jsonl" > "$work/tp2dp2.log" 2>&1 \
  || { cat "$work/tp2dp2.log"; exit 1; }
compare "$work/serial.jsonl" "$work/tp2dp2.jsonl" 1e-5
[[ "$(cat "$work/ckpt/latest_checkpointed_iteration.txt")" == 10 ]]

"$launch" --nproc_per_node 4 -- "$train" "${common[@]}" \
  --tensor-model-parallel-size 1 --use-distributed-optimizer --overlap-param-gather \
  --load "$work/ckpt" --metrics-file "$work/dp4.jsonl" > "$work/dp4.log" 2>&1 \
  || { cat "$work/dp4.log"; exit 1; }
[[ "$(first_iteration "$work/dp4.jsonl")" == 11 ]]
compare "$work/serial.jsonl" "$work/dp4.jsonl" 1e-5

# Same multi-process layout: resuming the TP 2 x DP 2 checkpoint under TP 2 x
# DP 2 continues exactly as 20 steps straight in that layout, bit for bit.
"$launch" --nproc_per_node 4 -- "$train" "${common[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --metrics-file "$work/tp2dp2_straight.jsonl" > "$work/tp2dp2_straight.log" 2>&1 \
  || { cat "$work/tp2dp2_straight.log"; exit 1; }
"$launch" --nproc_per_node 4 -- "$train" "${common[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel --load "$work/ckpt" \
  --metrics-file "$work/tp2dp2_resumed.jsonl" > "$work/tp2dp2_resumed.log" 2>&1 \
  || { cat "$work/tp2dp2_resumed.log"; exit 1; }
diff <(losses "$work/tp2dp2_straight.jsonl" | tail -10) <(losses "$work/tp2dp2_resumed.jsonl")

# Same layout, one process: 10 steps, save, resume, 10 more equals 20
# straight, exactly.
"$train" "${common[@]}" --train-iters 10 --save "$work/serial_ckpt" \
  --metrics-file "$work/first.jsonl" > "$work/first.log" 2>&1 || { cat "$work/first.log"; exit 1; }
"$train" "${common[@]}" --load "$work/serial_ckpt" \
  --metrics-file "$work/second.jsonl" > "$work/second.log" 2>&1 || { cat "$work/second.log"; exit 1; }
diff <(losses "$work/serial.jsonl" | tail -10) <(losses "$work/second.jsonl")
echo "end-to-end: parity and resume OK"
