#!/usr/bin/env bash
# End to end, in real processes: a Llama-architecture model (--preset
# llama-tiny: RMSNorm, SwiGLU, RoPE, 4 query heads over 2 K/V groups, untied
# output layer, no biases) matches the serial run's losses within 1e-5
# relative (fp32 reduction order over 10 steps) under TP 2 + SP (GQA's K/V
# groups split over TP, RoPE on sequence-parallel activations), PP 2 (the
# untied output layer on the last stage only; with full recomputation), DP 2
# + ZeRO-3 and TP 2 x PP 2 with SP (4 processes).
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--preset llama-tiny --mock-data --micro-batch-size 2
        --global-batch-size 8 --eval-iters 0 --log-interval 1
        --train-iters 10 --lr-decay-iters 10 --num-threads 1)

run serial 1
grep -q "training a Llama (RMSNorm, SwiGLU, RoPE, GQA 4/2, untied, no bias)" "$work/serial.log" \
  || { echo "the preset did not give the Llama architecture:"; grep "training a" "$work/serial.log"; exit 1; }
run tp2_sp 2 --tensor-model-parallel-size 2 --sequence-parallel
compare "$work/serial.jsonl" "$work/tp2_sp.jsonl" 1e-5
run pp2 2 --pipeline-model-parallel-size 2 --recompute-granularity full
compare "$work/serial.jsonl" "$work/pp2.jsonl" 1e-5
run dp2_zero3 2 --data-parallel-sharding-strategy optim_grads_params
compare "$work/serial.jsonl" "$work/dp2_zero3.jsonl" 1e-5
run tp2_pp2 4 --tensor-model-parallel-size 2 --sequence-parallel \
  --pipeline-model-parallel-size 2
compare "$work/serial.jsonl" "$work/tp2_pp2.jsonl" 1e-5
# The losses moved: the runs trained (a broken step would also match).
awk 'NR == 1 { first = $2 } END { if (!($2 < first)) { print "loss did not fall: " first " -> " $2; exit 1 } }' \
  <(losses "$work/serial.jsonl")
echo "Llama parity: TP 2 + SP, PP 2, DP 2 + ZeRO-3, TP 2 x PP 2 OK"
