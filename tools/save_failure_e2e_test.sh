#!/usr/bin/env bash
# A checkpoint save that fails (its directory's parent is a regular file):
# without --continue-on-save-failure the run stops with an error naming the
# path; with it, sync and async, the failure is logged and the run trains to
# its last iteration and exits 0.
set -euo pipefail
train=$1
work=${TEST_TMPDIR:-$(mktemp -d)}
: > "$work/not_a_dir"
run() {
  "$train" --mock-data --vocab-size 64 --num-layers 1 --hidden-size 16 \
    --num-attention-heads 2 --seq-length 8 --micro-batch-size 1 \
    --global-batch-size 2 --train-iters 4 --log-interval 1 --eval-iters 0 \
    --num-threads 1 --save "$work/not_a_dir/ckpt" --save-interval 2 "$@"
}
for mode in sync async; do
  extra=()
  [[ $mode == async ]] && extra=(--async-save)
  if run "${extra[@]}" > "$work/stop.log" 2>&1; then
    cat "$work/stop.log"; echo "$mode: a failed save did not stop the run"; exit 1
  fi
  grep -q "not_a_dir" "$work/stop.log" ||
    { cat "$work/stop.log"; echo "$mode: the error does not name the path"; exit 1; }
  run "${extra[@]}" --continue-on-save-failure > "$work/go.log" 2>&1 ||
    { cat "$work/go.log"; echo "$mode: the run stopped despite the flag"; exit 1; }
  n=$(grep -c "checkpoint save failed: .*not_a_dir" "$work/go.log" || true)
  [[ $n -ge 1 ]] || { cat "$work/go.log"; echo "$mode: no failure logged"; exit 1; }
  grep -Eq "iteration +4/" "$work/go.log" ||
    { cat "$work/go.log"; echo "$mode: did not reach iteration 4"; exit 1; }
  echo "$mode: stops without the flag, $n failure(s) logged and trains on with it"
done
