#!/usr/bin/env bash
# Stopping early and resuming, in real processes (DP 2 under tools/launch):
# --exit-signal-handler (SIGTERM to the launcher mid-run, as SLURM sends
# before it ends a job), --exit-interval and --exit-duration-in-mins. Each
# stops every rank after the same step, saves, and exits 0; the resumed run
# finishes with every iteration's loss equal, bit for bit, to an
# uninterrupted run's.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_gpt[@]}" --train-iters 12 --lr-decay-iters 12)

run straight 2

# The last loss logged for each iteration of the given metrics files.
last_losses() { cat "$@" | losses /dev/stdin | awk '{ l[$1] = $2 } END { for (i in l) print i, l[i] }' | sort -n; }

# resume_and_compare NAME: resumes the stopped run NAME to the end and
# compares every iteration's last loss with the uninterrupted run's.
resume_and_compare() {
  local name=$1
  run "${name}_resumed" 2 --load "$work/$name" --save "$work/$name"
  diff <(last_losses "$work/straight.jsonl") \
       <(last_losses "$work/$name.jsonl" "$work/${name}_resumed.jsonl")
  [[ "$(last_losses "$work/$name.jsonl" "$work/${name}_resumed.jsonl" | wc -l)" == 12 ]]
}

# --exit-interval 5: stops after iteration 5 with iter 5 saved.
run interval 2 --save "$work/interval" --save-interval 100 --exit-interval 5
grep -q "stopping after iteration 5 of 12: the iteration is a multiple of 5" "$work/interval.log" \
  || { cat "$work/interval.log"; exit 1; }
[[ "$(cat "$work/interval/latest_checkpointed_iteration.txt")" == 5 ]]
resume_and_compare interval

# --exit-duration-in-mins: a budget spent within the first step.
run duration 2 --save "$work/duration" --exit-duration-in-mins 0.00001
grep -q "stopping after iteration 1 of 12: the run has lasted" "$work/duration.log" \
  || { cat "$work/duration.log"; exit 1; }
resume_and_compare duration

# --exit-signal-handler: SIGTERM to the launcher once iteration 3 is logged
# (rank 1 is slowed so the run cannot end first). The launcher forwards it;
# every rank finishes its step, rank 0 saves, the job exits 0.
MCC_CHAOS_SLOW_RANK=1 MCC_CHAOS_SLOW_MS=150 \
"$launch" --nproc_per_node 2 --grace-period-s 20 -- \
  "$train" "${common[@]}" --save "$work/signal" --save-interval 100 \
  --exit-signal-handler --metrics-file "$work/signal.jsonl" \
  > "$work/signal.log" 2>&1 &
launcher=$!
wait_for_iterations "$work/signal.jsonl" 3 || true
kill -TERM "$launcher"
code=0
wait "$launcher" || code=$?
[[ $code == 0 ]] || { echo "exit $code after SIGTERM"; cat "$work/signal.log"; exit 1; }
grep -q "SIGTERM received (--exit-signal-handler)" "$work/signal.log" || { cat "$work/signal.log"; exit 1; }
stopped=$(cat "$work/signal/latest_checkpointed_iteration.txt")
(( stopped >= 3 && stopped < 12 )) || { echo "stopped at $stopped"; cat "$work/signal.log"; exit 1; }
resume_and_compare signal
echo "early exits: interval, duration and SIGTERM each saved, exited 0 and resumed bit for bit (SIGTERM stopped after iteration $stopped)"
