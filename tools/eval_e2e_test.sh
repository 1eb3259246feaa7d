#!/usr/bin/env bash
# End to end, in real processes: tools/train makes a small checkpoint on mock
# data; tools/eval then reproduces train's validation and test losses from
# it (serially and under TP 2), generates greedily with and without the KV
# cache and under TP 2 (the same continuation every time), and rejects a
# model flag that disagrees with the checkpoint (one line, exit code 2).
set -euo pipefail
launch=$1
train=$2
eval=$3
work=${TEST_TMPDIR:-$(mktemp -d)}
model=(--mock-data --vocab-size 512 --num-layers 2 --hidden-size 64
       --num-attention-heads 4 --seq-length 64 --num-threads 1)

run() {  # run LOG CMD...: runs CMD, showing LOG when it fails.
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { echo "FAILED ($?): $*"; cat "$log"; exit 1; }
}
fail() { echo "FAILED: $*"; exit 1; }

run "$work/train.log" "$train" "${model[@]}" --micro-batch-size 2 \
  --train-iters 20 --eval-iters 4 --eval-interval 20 --log-interval 10 \
  --save "$work/ckpt"

# Evaluation: the losses train printed for its last validation and the test
# split, from the saved weights.
train_valid=$(sed -n 's/.*validation loss at iteration 20: \([0-9.]*\).*/\1/p' "$work/train.log")
train_test=$(sed -n 's/.*test loss: \([0-9.]*\).*/\1/p' "$work/train.log")
[[ -n "$train_valid" && -n "$train_test" ]] || fail "train printed no losses"
run "$work/eval.log" "$eval" --load "$work/ckpt" --mock-data --eval-iters 4 \
  --micro-batch-size 2 --num-threads 1
grep -q "^validation loss $train_valid | perplexity" "$work/eval.log" \
  || fail "validation loss differs from train's $train_valid: $(cat "$work/eval.log")"
grep -q "^test loss $train_test | perplexity" "$work/eval.log" \
  || fail "test loss differs from train's $train_test: $(cat "$work/eval.log")"
run "$work/eval_tp2.log" "$launch" --nproc_per_node 2 -- "$eval" \
  --load "$work/ckpt" --mock-data --eval-iters 4 --micro-batch-size 2 \
  --num-threads 1 --tensor-model-parallel-size 2
awk -v v="$train_valid" -v t="$train_test" '
  /\] validation loss/ { d = $5 - v; if (d < 0) d = -d; if (d > 1e-3) bad = 1; n++ }
  /\] test loss/ { d = $5 - t; if (d < 0) d = -d; if (d > 1e-3) bad = 1; n++ }
  END { exit (n == 2 && !bad) ? 0 : 1 }' "$work/eval_tp2.log" \
  || fail "TP 2 losses differ from train's $train_valid $train_test: $(grep loss "$work/eval_tp2.log")"

# Generation: greedy, the same text with and without the cache, and under
# TP 2 (rank 0 prints; the launcher prefixes "[rank 0] ").
gen=(--load "$work/ckpt" --prompt "Hello, world" --temperature 0
     --max-new-tokens 24 --num-threads 1)
text() { sed -n 's/^\(\[rank 0\] \)\{0,1\}\(prompt: .*\|continuation: .*\|generated [0-9]* tokens ([^)]*)\).*/\2/p' "$1"; }
run "$work/gen.log" "$eval" "${gen[@]}"
grep -q "^continuation: ." "$work/gen.log" || fail "no continuation: $(cat "$work/gen.log")"
grep -q "^generated 24 tokens (token limit).*tokens/s (KV cache)" "$work/gen.log" \
  || fail "no generation summary: $(cat "$work/gen.log")"
[[ $(text "$work/gen.log" | wc -l) == 3 ]] || fail "unexpected output: $(cat "$work/gen.log")"
run "$work/gen_nocache.log" "$eval" "${gen[@]}" --no-kv-cache
diff <(text "$work/gen.log") <(text "$work/gen_nocache.log") \
  || fail "greedy text differs without the KV cache"
run "$work/gen_tp2.log" "$launch" --nproc_per_node 2 -- "$eval" "${gen[@]}" \
  --tensor-model-parallel-size 2
diff <(text "$work/gen.log") <(text "$work/gen_tp2.log") \
  || fail "greedy text differs under TP 2"
# Sampling: the same seed draws the same tokens under TP 2.
sample=(--temperature 0.9 --top-k 40 --top-p 0.95 --seed 7)
run "$work/sample.log" "$eval" "${gen[@]}" "${sample[@]}"
run "$work/sample_tp2.log" "$launch" --nproc_per_node 2 -- "$eval" "${gen[@]}" \
  "${sample[@]}" --tensor-model-parallel-size 2
diff <(text "$work/sample.log") <(text "$work/sample_tp2.log") \
  || fail "sampled text differs under TP 2"

# A model flag that disagrees with the checkpoint: one line, exit code 2.
set +e
"$eval" --load "$work/ckpt" --prompt hi --hidden-size 96 > "$work/bad.out" 2> "$work/bad.err"
code=$?
set -e
[[ $code == 2 ]] || fail "wrong --hidden-size exited $code: $(cat "$work/bad.err")"
[[ $(wc -l < "$work/bad.err") == 1 ]] || fail "not one line: $(cat "$work/bad.err")"
grep -q -- "--hidden-size 96 disagrees with the checkpoint's hidden_size 64" "$work/bad.err" \
  || fail "message does not name the flag and values: $(cat "$work/bad.err")"
set +e
"$eval" --prompt hi > /dev/null 2> "$work/noload.err"
code=$?
set -e
[[ $code == 2 ]] && grep -q -- "--load" "$work/noload.err" \
  || fail "missing --load exited $code: $(cat "$work/noload.err")"
echo "eval end-to-end: losses, generation (cache, no cache, TP 2), flag errors OK"
