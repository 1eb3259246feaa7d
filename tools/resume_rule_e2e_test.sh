#!/usr/bin/env bash
# The --load rule (README "Checkpoints"): a --load directory without a
# checkpoint exits 2 unless it is also --save (auto-resume starts fresh); a
# corrupt tracker is an error naming it, never a fresh start over the real
# checkpoints; a re-save killed between its two renames (iter_N only as
# iter_N.old) and a dead save's iter_N.tmp are repaired by the next start,
# which resumes from iter_N. eval and convert_checkpoint refuse the corrupt
# tracker too.
set -euo pipefail
train=$1
eval_bin=$2
convert=$3
work=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
run() {
  "$train" --mock-data --vocab-size 64 --num-layers 1 --hidden-size 16 \
    --num-attention-heads 2 --seq-length 8 --micro-batch-size 1 \
    --global-batch-size 2 --log-interval 1 --eval-iters 0 --num-threads 1 \
    "$@"
}
ckpt=$work/ckpt
tracker=$ckpt/latest_checkpointed_iteration.txt

# --load of an empty directory (not --save): exit 2, saying so.
mkdir -p "$work/empty"
code=0
run --train-iters 2 --load "$work/empty" > "$work/empty.log" 2>&1 || code=$?
[[ $code == 2 ]] || fail "--load of an empty directory exited $code: $(cat "$work/empty.log")"
grep -q "holds no checkpoint" "$work/empty.log" || fail "no reason given: $(cat "$work/empty.log")"
[[ ! -e $work/empty/iter_0000002 ]] || fail "it trained anyway"

# Auto-resume's first start: fresh, logged.
run --train-iters 2 --save "$ckpt" --save-interval 2 --load "$ckpt" > "$work/first.log" 2>&1 ||
  fail "first start: $(cat "$work/first.log")"
grep -q "starting from scratch (auto-resume)" "$work/first.log" || fail "fresh start not logged"
[[ $(cat "$tracker") == 2 ]] || fail "tracker holds $(cat "$tracker")"
sum=$(md5sum < "$ckpt/iter_0000002/metadata.pb")

# A corrupt tracker: an error naming it; iteration 2 is not overwritten.
echo garbage > "$tracker"
code=0
run --train-iters 2 --save "$ckpt" --save-interval 2 --load "$ckpt" > "$work/corrupt.log" 2>&1 || code=$?
[[ $code != 0 ]] || fail "a corrupt tracker started a run: $(cat "$work/corrupt.log")"
grep -q "latest_checkpointed_iteration.txt" "$work/corrupt.log" ||
  fail "the error does not name the tracker: $(cat "$work/corrupt.log")"
[[ $(md5sum < "$ckpt/iter_0000002/metadata.pb") == "$sum" ]] || fail "iteration 2 was overwritten"
for tool in eval convert; do
  code=0
  if [[ $tool == eval ]]; then
    "$eval_bin" --load "$ckpt" --prompt-ids "1 2" --max-new-tokens 1 > "$work/$tool.log" 2>&1 || code=$?
  else
    "$convert" --load "$ckpt" --export-hf "$work/hf" > "$work/$tool.log" 2>&1 || code=$?
  fi
  [[ $code != 0 ]] || fail "$tool loaded past a corrupt tracker"
  grep -q "latest_checkpointed_iteration.txt" "$work/$tool.log" ||
    fail "$tool's error does not name the tracker: $(cat "$work/$tool.log")"
done

# The tracker names iteration 2, which a killed re-save left only as .old,
# beside a dead save's temporary directory: the next start restores it and
# resumes from iteration 2.
echo 2 > "$tracker"
mv "$ckpt/iter_0000002" "$ckpt/iter_0000002.old"
mkdir -p "$ckpt/iter_0000004.tmp"
run --train-iters 4 --save "$ckpt" --save-interval 2 --load "$ckpt" > "$work/restore.log" 2>&1 ||
  fail "restart after a killed re-save: $(cat "$work/restore.log")"
grep -q "restoring .*iter_0000002 from .*iter_0000002.old" "$work/restore.log" ||
  fail "restore not logged: $(cat "$work/restore.log")"
grep -q "loaded .*iter_0000002 (iteration 2" "$work/restore.log" ||
  fail "did not resume from iteration 2: $(cat "$work/restore.log")"
[[ $(md5sum < "$ckpt/iter_0000002/metadata.pb") == "$sum" ]] || fail "iteration 2 not restored as it was"
[[ ! -e $ckpt/iter_0000002.old && ! -e $ckpt/iter_0000004.tmp ]] || fail "leftovers: $(ls "$ckpt")"
[[ $(cat "$tracker") == 4 ]] || fail "tracker holds $(cat "$tracker")"
echo "PASS"
