#!/usr/bin/env bash
# The library and the binary are the same run: train_gpt (training::Run with
# a TrainConfig, no flags) against tools/train with the same settings as
# flags, serially (train's default model) and on 8 processes (TP 2 x PP 2 x
# DP 2 with the distributed optimizer). Losses must be identical and every
# checkpoint file byte-identical, but for metadata.pb's creation time. Then
# eval_gpt (training::EvaluateCheckpoint) against tools/eval on the default
# run's checkpoint: the same losses and the same greedy continuation.
set -uo pipefail
train_gpt=$1
train=$2
launch=$3
eval_gpt=$4
eval=$5
tmp=${TEST_TMPDIR:-$(mktemp -d)}
failed=0

# compare NAME DIR_A DIR_B: the metrics files' losses and the checkpoints.
compare() {
  local name=$1 a=$2 b=$3
  if ! cmp -s <(grep -o '"loss": [^,]*' "$a/metrics.jsonl") \
      <(grep -o '"loss": [^,]*' "$b/metrics.jsonl"); then
    echo "FAIL: ${name}: losses differ"
    diff <(grep -o '"loss": [^,]*' "$a/metrics.jsonl") \
      <(grep -o '"loss": [^,]*' "$b/metrics.jsonl") | head
    failed=1
    return
  fi
  local files
  files=$(cd "$a/ckpt" && find . -type f | sort)
  if [[ "$files" != "$(cd "$b/ckpt" && find . -type f | sort)" ]]; then
    echo "FAIL: ${name}: the checkpoints hold different files"
    failed=1
    return
  fi
  local f
  for f in $files; do
    if [[ "$f" == */metadata.pb ]]; then
      # created_unix_seconds is the last field: differences only in the
      # final 6 bytes (its varint), and none in the size.
      local size last
      size=$(stat -c %s "$a/ckpt/$f")
      if [[ "$size" != "$(stat -c %s "$b/ckpt/$f")" ]]; then
        echo "FAIL: ${name}: $f sizes differ"
        failed=1
        continue
      fi
      last=$(cmp -l "$a/ckpt/$f" "$b/ckpt/$f" | awk '{print $1}' | head -1)
      if [[ -n "$last" && "$last" -le $((size - 6)) ]]; then
        echo "FAIL: ${name}: $f differs at byte $last of $size"
        failed=1
      fi
    elif ! cmp -s "$a/ckpt/$f" "$b/ckpt/$f"; then
      echo "FAIL: ${name}: $f differs"
      failed=1
    fi
  done
  echo "${name}: $(grep -c '"loss"' "$a/metrics.jsonl") losses and $(echo "$files" | wc -l) checkpoint files identical"
}

# run NAME NPROC FLAGS...: the same run through both doors.
run() {
  local name=$1 nproc=$2
  shift 2
  local pairs=("$@") flags=() config="" i=0
  while [[ $i -lt ${#pairs[@]} ]]; do
    local key=${pairs[$i]#--} value=${pairs[$((i + 1))]}
    flags+=("--${key}=${value}")
    key=${key//-/_}
    if [[ "$value" =~ ^-?[0-9.e-]+$ || "$value" == true ]]; then
      config+="${key}: ${value}"$'\n'
    else
      config+="${key}: \"${value}\""$'\n'
    fi
    i=$((i + 2))
  done
  mkdir -p "$tmp/$name/flags" "$tmp/$name/library"
  printf '%ssave: "%s"\nmetrics_file: "%s"\n' "$config" \
    "$tmp/$name/library/ckpt" "$tmp/$name/library/metrics.jsonl" \
    > "$tmp/$name/config.txt"
  local -a prefix=()
  [[ $nproc -gt 1 ]] && prefix=("$launch" --nproc_per_node "$nproc" --)
  if ! timeout 300 "${prefix[@]}" "$train" "${flags[@]}" \
      --save "$tmp/$name/flags/ckpt" \
      --metrics-file "$tmp/$name/flags/metrics.jsonl" \
      > "$tmp/$name/flags.log" 2>&1; then
    echo "FAIL: ${name}: train failed"; tail -5 "$tmp/$name/flags.log"
    failed=1
    return
  fi
  if ! timeout 300 "${prefix[@]}" "$train_gpt" "$tmp/$name/config.txt" \
      > "$tmp/$name/library.log" 2>&1; then
    echo "FAIL: ${name}: train_gpt failed"; tail -5 "$tmp/$name/library.log"
    failed=1
    return
  fi
  compare "$name" "$tmp/$name/flags" "$tmp/$name/library"
}

# train's default model and data (the embedded corpus), shortened.
run default 1 --train-iters 12 --log-interval 4 --eval-interval 6 \
  --num-threads 1
run tp2_pp2_dp2_zero1 8 --mock-data true --vocab-size 256 --num-layers 4 \
  --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
  --micro-batch-size 2 --global-batch-size 16 --eval-iters 2 \
  --eval-interval 3 --log-interval 1 --train-iters 6 --num-threads 1 \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
  --use-distributed-optimizer true
# The library and tools/eval on the default run's checkpoint, on DP 2 (the
# launcher prefixes each line with its rank).
ckpt="$tmp/default/library/ckpt"
if ! timeout 300 "$launch" --nproc_per_node 2 -- "$eval_gpt" "$ckpt" "The" \
    > "$tmp/eval_gpt.log" 2> "$tmp/eval_gpt.err"; then
  echo "FAIL: eval_gpt failed"; tail -5 "$tmp/eval_gpt.err"; failed=1
elif ! timeout 300 "$launch" --nproc_per_node 2 -- "$eval" --load "$ckpt" \
    --eval-iters 4 --num-threads 1 \
    --prompt "The" --temperature 0 --max-new-tokens 16 \
    > "$tmp/eval.log" 2> "$tmp/eval.err"; then
  echo "FAIL: tools/eval failed"; tail -5 "$tmp/eval.err"; failed=1
else
  for pattern in '] validation loss' '] test loss' '] continuation:'; do
    a=$(grep "$pattern" "$tmp/eval_gpt.log")
    b=$(grep "$pattern" "$tmp/eval.log")
    if [[ -z "$a" || "$a" != "$b" ]]; then
      echo "FAIL: eval_gpt and tools/eval differ on $pattern: '$a' vs '$b'"
      failed=1
    fi
  done
  [[ $failed -eq 0 ]] && echo "eval: eval_gpt and tools/eval print the same losses and continuation"
fi
exit ${failed}
