#!/usr/bin/env bash
# The rerun check in real processes (DP 2, distributed optimizer, dropout
# on): injected transient errors rerun their steps from the same state, the
# log says they did not reproduce, and every loss equals, bit for bit, a run
# without injections; persistent ones reproduce.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_gpt[@]}" --train-iters 8 --lr-decay-iters 8
        --hidden-dropout 0.1 --attention-dropout 0.1
        --use-distributed-optimizer --rerun-mode validate_results)

run plain 2
run transient 2 --error-injection-rate 3 --error-injection-type transient_error
run persistent 2 --error-injection-rate 4 --error-injection-type persistent_error

# Iterations 3 and 6 rerun and do not reproduce; nothing else reruns.
[[ "$(grep -c "not reproduced, a transient fault" "$work/transient.log")" == 2 ]] \
  || { cat "$work/transient.log"; exit 1; }
grep -q "iteration 6: the loss is nan; rerun from the same state" "$work/transient.log" \
  || { cat "$work/transient.log"; exit 1; }
if grep -q "rerun from the same state" "$work/plain.log"; then cat "$work/plain.log"; exit 1; fi
# The reruns' results are the first runs' (dropout masks drawn again).
diff <(losses "$work/plain.jsonl") <(losses "$work/transient.jsonl")
diff <(losses "$work/plain.jsonl") <(losses "$work/persistent.jsonl")
[[ "$(grep -c "reproduced, so the data or the model caused it" "$work/persistent.log")" == 2 ]] \
  || { cat "$work/persistent.log"; exit 1; }
echo "rerun check: transient injections not reproduced, persistent ones reproduced, losses bit for bit"
