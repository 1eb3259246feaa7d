#!/usr/bin/env bash
# train --tensorboard-dir: a 20-step run with validation writes one event
# file that an independent reader (Debian's python3-protobuf and
# python3-crc32c) decodes, with every scalar present at every step, and the
# loss equal to the --metrics-file's.
set -euo pipefail
train=$1
reader=$2
work=${TEST_TMPDIR:-$(mktemp -d)}
"$train" --mock-data --vocab-size 128 --num-layers 2 --hidden-size 32 \
  --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 \
  --global-batch-size 4 --train-iters 20 --log-interval 1 --eval-iters 2 \
  --eval-interval 5 --num-threads 1 --peak-tflops 1 \
  --tensorboard-dir "$work/tb" --log-timers-to-tensorboard \
  --log-memory-to-tensorboard --metrics-file "$work/m.jsonl" \
  > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
files=("$work"/tb/events.out.tfevents.*)
[[ ${#files[@]} == 1 ]] || { echo "want one event file, got ${files[*]}"; exit 1; }
/usr/bin/python3 "$reader" --dump "${files[0]}" > "$work/scalars.tsv"
for tag in "lm loss" learning-rate grad-norm loss-scale batch-size \
    iteration-time tokens-per-second throughput mfu forward-backward-time \
    grad-sync-time optimizer-time mem-allocated-bytes mem-max-allocated-bytes; do
  n=$(awk -F'\t' -v t="$tag" '$2 == t' "$work/scalars.tsv" | wc -l)
  [[ $n == 20 ]] || { echo "tag '$tag': $n scalars, want 20"; exit 1; }
done
for tag in "lm loss validation" "lm loss validation ppl"; do
  n=$(awk -F'\t' -v t="$tag" '$2 == t' "$work/scalars.tsv" | wc -l)
  [[ $n == 4 ]] || { echo "tag '$tag': $n scalars, want 4"; exit 1; }
done
# The loss per step is the metrics file's (fp32 in the event file).
paste <(awk -F'\t' '$2 == "lm loss" { print $1, $3 }' "$work/scalars.tsv") \
      <(sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$work/m.jsonl") |
  awk '{ if ($1 != $3) { print "step", $1, "vs", $3; bad = 1 }
         d = $2 - $4; if (d < 0) d = -d; m = $4 < 0 ? -$4 : $4
         if (d > 1e-6 * m) { print "step", $1, "loss", $2, "vs metrics", $4; bad = 1 } }
       END { exit bad }'
echo "tensorboard: 20 steps, every scalar present, losses match"
