#!/usr/bin/env bash
# Elastic restart, in real processes: under tools/launch --max-restarts 1, a
# rank of a DP 2 job is killed with SIGKILL mid-run. The launcher stops the
# job, starts it again, the ranks resume from the latest checkpoint (--load
# equal to --save), and the job finishes by itself with every iteration's
# loss equal, bit for bit, to an uninterrupted run's.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_gpt[@]}" --train-iters 14 --lr-decay-iters 14)

run straight 2

ckpt="$work/ckpt"
# Rank 1 kills itself (SIGKILL) once iteration 7 is done (after the
# checkpoint of 4), in the first attempt only: a fixed moment, where a kill
# from outside would race the short run.
MCC_CHAOS_KILL_AT_ITERATION=7 MCC_CHAOS_KILL_RANK=1 \
"$launch" --nproc_per_node 2 --max-restarts 1 --grace-period-s 2 -- \
  "$train" "${common[@]}" --save "$ckpt" --load "$ckpt" --save-interval 4 \
  --metrics-file "$work/elastic.jsonl" > "$work/elastic.log" 2>&1 &
launcher=$!
wait "$launcher" || { echo "the job did not finish after the restart"; cat "$work/elastic.log"; exit 1; }
grep -q "restarting the job (restart 1 of 1)" "$work/elastic.log" || { cat "$work/elastic.log"; exit 1; }
grep -q "MCC_CHAOS_KILL_AT_ITERATION=7: killing rank 1" "$work/elastic.log" || { cat "$work/elastic.log"; exit 1; }
# The last loss logged for each iteration (the restart repeats some) equals
# the uninterrupted run's, exactly.
last_losses() { losses "$1" | awk '{ l[$1] = $2 } END { for (i in l) print i, l[i] }' | sort -n; }
diff <(last_losses "$work/straight.jsonl") <(last_losses "$work/elastic.jsonl")
[[ "$(last_losses "$work/elastic.jsonl" | wc -l)" == 14 ]]
echo "elastic restart: rank killed, job restarted and resumed, losses identical"
