#!/usr/bin/env bash
# Checkpoints of expert weights split over expert tensor parallelism (issue
# 41). Each expert weight is stored as the full [E, ...] tensor (SwiGLU's fc1
# [E, 2f, h] with gate and up stacked, so an ETP slice is two row blocks), so:
# an ETP 2 checkpoint (DP 4, the distributed optimizer sharding expert state
# over the expert-data-parallel group) and an EP 2 x ETP 2 one resume
# serially, the ETP 2 one also at EP 2 x ETP 2, and a serial checkpoint
# resumes at ETP 2 and at EP 2 x ETP 2, each within 1e-6 of the straight
# serial run.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_moe_flags[@]}" --moe-layer-freq "[1,1]" --num-experts 8
        --moe-token-dispatcher-type alltoall)

# resumed NAME: NAME resumed at iteration 10 and equals the serial run.
resumed() {
  [[ $(first_iteration "$work/$1.jsonl") == 15 ]] || { echo "$1 did not resume"; exit 1; }
  compare "$work/serial.jsonl" "$work/$1.jsonl" 1e-6
  echo "$1 vs serial: $(worst "$work/serial.jsonl" "$work/$1.jsonl")"
}

run serial 1
run serial10 1 --train-iters 10 --save "$work/serial10"

run etp2 4 --expert-tensor-parallel-size 2 --use-distributed-optimizer \
  --train-iters 10 --save "$work/etp2"
compare "$work/serial.jsonl" "$work/etp2.jsonl" 1e-5
echo "etp2 vs serial: $(worst "$work/serial.jsonl" "$work/etp2.jsonl")"
run ep2_etp2 4 --expert-model-parallel-size 2 --expert-tensor-parallel-size 2 \
  --train-iters 10 --save "$work/ep2_etp2"
compare "$work/serial.jsonl" "$work/ep2_etp2.jsonl" 1e-5
echo "ep2_etp2 vs serial: $(worst "$work/serial.jsonl" "$work/ep2_etp2.jsonl")"

run from_etp2_serial 1 --load "$work/etp2"
run from_etp2_ep2_etp2 4 --load "$work/etp2" --expert-model-parallel-size 2 \
  --expert-tensor-parallel-size 2
run from_ep2_etp2_serial 1 --load "$work/ep2_etp2"
run from_serial_etp2 2 --load "$work/serial10" --expert-tensor-parallel-size 2
run from_serial_ep2_etp2 4 --load "$work/serial10" \
  --expert-model-parallel-size 2 --expert-tensor-parallel-size 2
for r in from_etp2_serial from_etp2_ep2_etp2 from_ep2_etp2_serial \
    from_serial_etp2 from_serial_ep2_etp2; do
  resumed "$r"
done
echo "expert tensor parallel checkpoints: resharded resume OK"
