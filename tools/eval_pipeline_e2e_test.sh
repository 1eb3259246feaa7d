#!/usr/bin/env bash
# tools/eval under pipeline parallelism, in real processes: a checkpoint
# trained serially and one trained under PP 2 are evaluated (validation and
# test loss, perplexity) and continued greedily under TP 1 PP 1, PP 2, PP 4
# and TP 2 x PP 2 (also without the KV cache); every layout matches TP 1
# PP 1 (losses within 1e-5, greedy tokens identical).
set -euo pipefail
launch=$1
train=$2
eval=$3
work=${TEST_TMPDIR:-$(mktemp -d)}
model=(--mock-data --vocab-size 512 --num-layers 4 --hidden-size 64
       --num-attention-heads 4 --seq-length 64 --num-threads 1)

fail() { echo "FAILED: $*"; exit 1; }
run() {  # run LOG CMD...: runs CMD, showing LOG when it fails.
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { echo "FAILED ($?): $*"; cat "$log"; exit 1; }
}

run "$work/train.log" "$train" "${model[@]}" --micro-batch-size 2 \
  --train-iters 10 --save "$work/ckpt"
run "$work/train_pp2.log" "$launch" --nproc_per_node 2 -- "$train" \
  "${model[@]}" --micro-batch-size 2 --global-batch-size 4 --train-iters 10 \
  --pipeline-model-parallel-size 2 --save "$work/ckpt_pp2"

# evaluate NAME NPROC CKPT FLAGS...: losses and a greedy continuation.
evaluate() {
  local name=$1 nproc=$2 ckpt=$3
  shift 3
  local args=(--load "$work/$ckpt" --mock-data --eval-iters 4
              --micro-batch-size 2 --num-threads 1 --prompt "Hello, world"
              --temperature 0 --max-new-tokens 16 "$@")
  if [[ $nproc == 1 ]]; then
    run "$work/$name.log" "$eval" "${args[@]}"
  else
    run "$work/$name.log" "$launch" --nproc_per_node "$nproc" -- "$eval" "${args[@]}"
  fi
  # "loss digits: SPLIT VALUE" and the continuation (rank 0's lines).
  sed -n 's/.*loss digits: \([a-z]*\) \([0-9.e+-]*\).*/\1 \2/p' "$work/$name.log" > "$work/$name.loss"
  sed -n 's/^\(\[rank 0\] \)\{0,1\}\(continuation: .*\)/\2/p' "$work/$name.log" > "$work/$name.text"
  [[ $(wc -l < "$work/$name.loss") == 2 ]] || fail "$name: no losses: $(cat "$work/$name.log")"
  [[ $(wc -l < "$work/$name.text") == 1 ]] || fail "$name: no continuation: $(cat "$work/$name.log")"
}
same() {  # same REF NAME: losses within 1e-5, identical greedy text.
  paste "$work/$1.loss" "$work/$2.loss" | awk -v a="$1" -v b="$2" '
    { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5) { print a, b, $0; bad = 1 } }
    END { exit bad }' || fail "$2 losses differ from $1"
  diff "$work/$1.text" "$work/$2.text" || fail "$2 continues differently from $1"
}

for ckpt in ckpt ckpt_pp2; do
  evaluate "${ckpt}_serial" 1 "$ckpt"
  evaluate "${ckpt}_pp2" 2 "$ckpt" --pipeline-model-parallel-size 2
  evaluate "${ckpt}_pp4" 4 "$ckpt" --pipeline-model-parallel-size 4
  evaluate "${ckpt}_tp2pp2" 4 "$ckpt" --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2
  # The engine's full-recompute mode runs in every layout too.
  evaluate "${ckpt}_tp2pp2_nocache" 4 "$ckpt" --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 --no-kv-cache
  for layout in pp2 pp4 tp2pp2 tp2pp2_nocache; do
    same "${ckpt}_serial" "${ckpt}_$layout"
  done
done
# A PP 2 checkpoint is the serial checkpoint's model, trained alike.
grep -q "." "$work/ckpt_pp2_serial.text" || fail "no text"
echo "eval under PP: losses and greedy text match TP 1 PP 1"
