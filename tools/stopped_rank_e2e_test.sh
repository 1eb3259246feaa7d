#!/usr/bin/env bash
# A stopped rank (SIGSTOP: a hung node) fails the job within
# --distributed-timeout-minutes, and tools/analyze_hang names it from the
# other rank's flight-recorder dump, as it names a dead one.
set -euo pipefail
launch=$1
train=$2
analyze_hang=$3
source "$4"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_gpt[@]}" --train-iters 100000)

start=$(date +%s)
"$launch" --nproc_per_node 2 --grace-period-s 2 -- \
  "$train" "${common[@]}" --distributed-timeout-minutes 0.1 \
  --flight-recorder-dir "$work/fr" --metrics-file "$work/run.jsonl" \
  > "$work/run.log" 2>&1 &
launcher=$!
wait_for_iterations "$work/run.jsonl" 2 || { cat "$work/run.log"; exit 1; }
# Rank 1: the launcher's child whose environment says RANK=1.
victim=""
for pid in $(pgrep -P "$launcher"); do
  # grep reads the file itself: under pipefail a tr feeding "grep -q" can
  # die of SIGPIPE once grep has matched, and the match would read false.
  if grep -qsxz "RANK=1" "/proc/$pid/environ"; then victim=$pid; fi
done
[[ -n $victim ]] || { echo "rank 1 not found"; cat "$work/run.log"; exit 1; }
stopped_at=$(date +%s)
kill -STOP "$victim"
code=0
wait "$launcher" || code=$?
took=$(( $(date +%s) - stopped_at ))
[[ $code != 0 ]] || { echo "the job went on without rank 1"; cat "$work/run.log"; exit 1; }
# The 6 s timeout, the launcher's 2 s grace, and slack for a busy machine.
(( took < 40 )) || { echo "took ${took}s to fail"; cat "$work/run.log"; exit 1; }
grep -q "did not complete within its timeout of 6s" "$work/run.log" || { cat "$work/run.log"; exit 1; }
"$analyze_hang" "$work/fr" > "$work/hang.txt" 2>&1 || { cat "$work/hang.txt"; exit 1; }
cat "$work/hang.txt"
grep -q "rank 1.*left no dump" "$work/hang.txt" || { cat "$work/run.log"; exit 1; }
echo "stopped rank 1: the job failed ${took}s later and analyze_hang named it"
