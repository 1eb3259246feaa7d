#!/usr/bin/env bash
# End to end, --rampup-batch-size (Megatron's batch-size ramp-up): a ramped
# run saved mid-ramp and resumed equals the straight run bit for bit (batch
# sizes, consumed samples, learning rates and losses); DP 2, PP 2 and
# interleaved PP 2 ramp as the serial run does; a DP 2 checkpoint resumed at DP 1 continues the ramp;
# sizes a layout cannot divide and bad values are refused naming the flag.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
# Global batch 2, 4, 6, then 8 from 12 consumed samples on (one increment
# every 4 samples).
base=(--mock-data --vocab-size 256 --num-layers 2 --hidden-size 32
      --num-attention-heads 4 --seq-length 32 --micro-batch-size 1
      --global-batch-size 8 --eval-iters 0 --log-interval 1 --train-iters 8
      --lr-decay-iters 8 --lr-warmup-iters 2 --num-threads 1)
common=("${base[@]}" --rampup-batch-size 2 2 12)

# "iteration consumed_samples global_batch_size lr" of a --metrics-file.
steps() {
  sed -n 's/.*"iteration": \([0-9]*\), "consumed_samples": \([0-9]*\), "global_batch_size": \([0-9]*\),.*"lr": \([^,]*\),.*/\1 \2 \3 \4/p' "$1"
}

run straight 1
# The ramp as Megatron's calculator gives it, read at each step's start.
diff <(steps "$work/straight.jsonl" | cut -d' ' -f1-3) - <<'STEPS'
1 2 2
2 4 2
3 8 4
4 14 6
5 22 8
6 30 8
7 38 8
8 46 8
STEPS

# Saved after iteration 3 (8 samples: the next step's batch is 6), resumed.
run first 1 --train-iters 3 --save "$work/ckpt"
run resumed 1 --load "$work/ckpt"
[[ "$(first_iteration "$work/resumed.jsonl")" == 4 ]]
diff <(steps "$work/straight.jsonl" | tail -5) <(steps "$work/resumed.jsonl")
diff <(losses "$work/straight.jsonl" | tail -5) <(losses "$work/resumed.jsonl")

# DP 2 and PP 2 ramp alike (1 to 4 micro-batches a step, per rank).
run dp2 2
diff <(steps "$work/straight.jsonl") <(steps "$work/dp2.jsonl")
compare "$work/straight.jsonl" "$work/dp2.jsonl" 1e-5
run pp2 2 --pipeline-model-parallel-size 2
diff <(steps "$work/straight.jsonl") <(steps "$work/pp2.jsonl")
compare "$work/straight.jsonl" "$work/pp2.jsonl" 1e-5

# Interleaved over 2 stages (2 virtual stages each; every count even).
run straight4 1 --num-layers 4
run vpp2 2 --num-layers 4 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
grep -q "interleaved" "$work/vpp2.log" || { cat "$work/vpp2.log"; exit 1; }
diff <(steps "$work/straight4.jsonl") <(steps "$work/vpp2.jsonl")
compare "$work/straight4.jsonl" "$work/vpp2.jsonl" 1e-5

# Resharded: DP 2's checkpoint after iteration 3 resumed at DP 1.
run dp2_first 2 --train-iters 3 --save "$work/ckpt_dp2"
run dp1_resumed 1 --load "$work/ckpt_dp2"
[[ "$(first_iteration "$work/dp1_resumed.jsonl")" == 4 ]]
diff <(steps "$work/straight.jsonl" | tail -5) <(steps "$work/dp1_resumed.jsonl")
compare "$work/straight.jsonl" "$work/dp1_resumed.jsonl" 1e-5

# A ramp by 1 (2 samples an increment) saved at DP 1 after 2 samples (next
# size 2; 3, 5 and 7 lie ahead) cannot resume at DP 2: refused, naming the
# flag and the size.
"$train" "${base[@]}" --rampup-batch-size 1 1 14 --train-iters 2 \
  --save "$work/ckpt_odd" > "$work/odd.log" 2>&1 || { cat "$work/odd.log"; exit 1; }
if "$launch" --nproc_per_node 2 -- "$train" "${base[@]}" \
    --rampup-batch-size 1 1 14 --load "$work/ckpt_odd" \
    > "$work/odd_dp2.log" 2>&1; then
  echo "resuming at DP 2 with odd sizes ahead was not refused"; exit 1
fi
grep -q -- "--rampup-batch-size 1 1 14: the ramp's global batch size 3 (still ahead after 2 consumed samples) is not divisible by --micro-batch-size (1) x data-parallel size (2)" "$work/odd_dp2.log" \
  || { cat "$work/odd_dp2.log"; exit 1; }

# Bad values: one line naming the flag, exit 2.
for bad in "2 4 12" "2 2" "0 2 12" "8 2 12" "2 2 0"; do
  set +e
  "$train" "${base[@]}" --rampup-batch-size $bad \
    > "$work/bad.out" 2> "$work/bad.err"
  code=$?
  set -e
  [[ $code == 2 ]] || { echo "'$bad': exit $code"; cat "$work/bad.err"; exit 1; }
  [[ $(wc -l < "$work/bad.err") == 1 ]] && grep -q -- "--rampup-batch-size" "$work/bad.err" \
    || { echo "'$bad':"; cat "$work/bad.err"; exit 1; }
done
echo "rampup end-to-end: resume, DP 2, PP 2 (1F1B, interleaved), resharding and refusals OK"
