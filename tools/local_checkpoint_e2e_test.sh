#!/usr/bin/env bash
# Local (non-persistent) checkpoints, in real processes: a DP 2 job saves to
# the shared --save every 4 iterations and to node-local directories every 2
# (--non-persistent-ckpt-type local, --replication: each rank's copy also
# kept by the other rank). Rank 1 is killed (SIGKILL) after iteration 7.
#  1. Under tools/launch --max-restarts 1 the job restarts and resumes from
#     the local copies of iteration 6, not the shared checkpoint of 4.
#  2. Killed again, without restarts; rank 1's local directory is deleted
#     (a replaced node): on the next start rank 1 fetches its copy from
#     rank 0, and both resume from iteration 6.
#  3. Killed again, both local copies of rank 1 corrupt or gone: every rank
#     falls back to the shared checkpoint (iteration 4).
# Every run finishes with each iteration's loss equal, bit for bit, to an
# uninterrupted run's.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_gpt[@]}" --train-iters 12 --lr-decay-iters 12)
local_flags=(--non-persistent-ckpt-type local --non-persistent-save-interval 2
             --replication)

run straight 2

fail() { echo "$1"; cat "$2"; exit 1; }
# The last loss logged for each iteration (a restart repeats some).
last_losses() { losses "$1" | awk '{ l[$1] = $2 } END { for (i in l) print i, l[i] }' | sort -n; }
same_losses() {
  diff <(last_losses "$work/straight.jsonl") <(last_losses "$1") \
    || fail "losses differ from the uninterrupted run" "$2"
  [[ "$(last_losses "$1" | wc -l)" == 12 ]] || fail "not 12 iterations" "$2"
}

# killed NAME MAX_RESTARTS: runs the job with rank 1 killed after iteration
# 7 (in the first attempt only), saving into $work/NAME.
killed() {
  local name=$1 restarts=$2
  MCC_CHAOS_KILL_AT_ITERATION=7 MCC_CHAOS_KILL_RANK=1 \
  "$launch" --nproc_per_node 2 --max-restarts "$restarts" --grace-period-s 2 -- \
    "$train" "${common[@]}" --save "$work/$name/shared" --load "$work/$name/shared" \
    --save-interval 4 "${local_flags[@]}" \
    --non-persistent-local-ckpt-dir "$work/$name/local" \
    --metrics-file "$work/$name.jsonl" > "$work/$name.log" 2>&1
}
# resume NAME: starts the job of killed NAME again, in a fresh process.
resume() {
  local name=$1
  "$launch" --nproc_per_node 2 -- \
    "$train" "${common[@]}" --save "$work/$name/shared" --load "$work/$name/shared" \
    --save-interval 4 "${local_flags[@]}" \
    --non-persistent-local-ckpt-dir "$work/$name/local" \
    --metrics-file "$work/$name.jsonl" > "$work/$name.resumed.log" 2>&1 \
    || fail "the resumed job failed" "$work/$name.resumed.log"
}

# 1. Restarted by the launcher, from the local copies.
killed restart 1 || fail "the job did not finish after the restart" "$work/restart.log"
grep -q "restarting the job (restart 1 of 1)" "$work/restart.log" || fail "no restart" "$work/restart.log"
grep -q "resuming from local checkpoints of iteration 6 (0 ranks fetched" "$work/restart.log" \
  || fail "did not resume from the local iteration 6" "$work/restart.log"
grep -q "loaded $work/restart/local/rank_00000/iter_0000006 " "$work/restart.log" \
  || fail "rank 0 did not load its local copy" "$work/restart.log"
same_losses "$work/restart.jsonl" "$work/restart.log"

# 2. Rank 1's local directory lost: fetched from rank 0.
if killed lost 0; then fail "the job was not killed" "$work/lost.log"; fi
rm -rf "$work/lost/local/rank_00001"
resume lost
log="$work/lost.resumed.log"
grep -q "rank 1: fetched local checkpoint iteration 6 from rank 0" "$log" \
  || fail "rank 1 did not fetch its copy from rank 0" "$log"
grep -q "resuming from local checkpoints of iteration 6 (1 ranks fetched" "$log" \
  || fail "did not resume from the local iteration 6" "$log"
same_losses "$work/lost.jsonl" "$log"

# 3. Rank 1's own copies corrupt, rank 0's replica of them gone: the shared
# checkpoint of iteration 4.
if killed gone 0; then fail "the job was not killed" "$work/gone.log"; fi
for shard in "$work"/gone/local/rank_00001/iter_*/shard_r00000.bin; do
  printf '\x55' | dd of="$shard" bs=1 seek=100 conv=notrunc status=none
done
rm -rf "$work/gone/local/replica_of_rank_00001"
resume gone
log="$work/gone.resumed.log"
grep -q "local checkpoint refused: .*rank_00001/iter_0000006/shard_r00000.bin does not match" "$log" \
  || fail "the corrupt shard was not refused by name" "$log"
grep -q "loaded $work/gone/shared/iter_0000004 " "$log" \
  || fail "did not fall back to the shared iteration 4" "$log"
same_losses "$work/gone.jsonl" "$log"
echo "local checkpoints: restarted from local copies, from a peer's copy, and from the shared directory when both copies were bad; losses identical"
