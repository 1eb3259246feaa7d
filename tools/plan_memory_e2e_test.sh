#!/usr/bin/env bash
# tools/plan's per-rank memory against real short runs (issue 46's memory
# check): every rank's allocator peak ("rank R peak memory: N bytes", train's
# last line) within 10% of the planner's prediction for its pipeline stage,
# for 1F1B and ZB-H1 with the stages' layers split 3 | 1
# (--decoder-last-pipeline-num-layers 1: 1F1B's prediction from train
# --dry-run, ZB-H1's from tools/plan's search, which lists that split beside
# the even one; ZB-H1's last stage keeps each micro-batch's weight-gradient
# inputs until W), interleaved 1F1B (two chunks a stage) and ZB-V (two chunks
# a stage in a V: stage 0 holds the embedding and the output layer), all at
# PP 2, HSDP with 2 instances of DP 2 (4 ranks), and the
# distributed optimizer with bf16 Adam moments (bf16 weights), whose saving
# against fp32 moments is the predicted state bytes.
set -euo pipefail
launch=$1
train=$2
plan=$3
work=${TEST_TMPDIR:-$(mktemp -d)}

# Activations matter here (256 tokens, a 4096-word vocabulary) ...
act=(--mock-data --vocab-size 4096 --num-layers 4 --hidden-size 128
     --num-attention-heads 4 --seq-length 256 --global-batch-size 8
     --micro-batch-size 2)
# ... and here the optimizer state does (hidden 256, 64 tokens).
state=(--mock-data --vocab-size 1024 --num-layers 4 --hidden-size 256
       --num-attention-heads 4 --seq-length 64 --global-batch-size 8
       --micro-batch-size 1)
lowered=(--use-precision-aware-optimizer --exp-avg-dtype bf16
         --exp-avg-sq-dtype bf16)

# run NAME PROCS FLAGS...: a 2-step run (the second step holds the
# optimizer's state beside the step's records); its ranks' peaks into
# NAME.peaks.
run() {
  local name=$1 procs=$2
  shift 2
  "$launch" --nproc_per_node "$procs" -- "$train" "$@" --train-iters 2 \
    --log-interval 1 --num-threads 1 > "$work/$name.log" 2>&1 \
    || { tail -20 "$work/$name.log"; exit 1; }
  sed -n 's/.*rank \([0-9]*\) peak memory: \([0-9]*\) bytes.*/\1 \2/p' \
    "$work/$name.log" | sort -n > "$work/$name.peaks"
  [[ $(wc -l < "$work/$name.peaks") == "$procs" ]] \
    || { echo "$name: not every rank reported its peak"; exit 1; }
}
# predict NAME PROCS FLAGS...: the planner's every layout at micro-batch
# sizes of the flags, JSON.
predict() {
  local name=$1 procs=$2
  shift 2
  "$plan" "$@" --device cpu --devices-per-node "$procs" --top 2000 \
    --include-not-fitting --json > "$work/$name.json"
}

uneven=(--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers 1)
run pp_1f1b 2 "${act[@]}" "${uneven[@]}"
run pp_zb 2 "${act[@]}" "${uneven[@]}" --pipeline-schedule zb-h1
run pp_interleaved 2 "${act[@]}" --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
run pp_zbv 2 "${act[@]}" --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1 --pipeline-schedule zbv
# The dry run beside the planner: both spend most of their time in the CPU
# probe's fixed time budgets, and memory does not depend on its timings.
"$launch" --nproc_per_node 2 -- "$train" "${act[@]}" "${uneven[@]}" \
  --dry-run --num-threads 1 > "$work/pp_1f1b.dry" 2>&1 &
dry_run=$!
predict act2 2 "${act[@]}" --micro-batches 2
wait "$dry_run" || { tail -20 "$work/pp_1f1b.dry"; exit 1; }
run hsdp 4 "${state[@]}" --use-distributed-optimizer \
  --num-distributed-optimizer-instances 2
predict state4 4 "${state[@]}" --micro-batches 1
run moments_fp32 2 "${state[@]}" --bf16 --use-distributed-optimizer
run moments_bf16 2 "${state[@]}" --bf16 --use-distributed-optimizer \
  "${lowered[@]}"
predict lowered2 2 "${state[@]}" --micro-batches 1 --bf16 "${lowered[@]}"

python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
def peaks(name):
    return [int(l.split()[1]) for l in open("%s/%s.peaks" % (work, name))]
def layout(plan, name):
    for l in json.load(open("%s/%s.json" % (work, plan)))["layouts"]:
        if l["layout"] == name:
            return l
    raise SystemExit("%s: the planner has no layout %s" % (plan, name))
failed = []
def check(what, measured, predicted):
    err = (predicted - measured) / measured
    print("%-34s measured %10d  predicted %10d  %+.1f%%" % (
        what, measured, predicted, 100 * err))
    if abs(err) > 0.10:
        failed.append(what)
# Pipeline stage s is rank s at PP 2 on 2 ranks.
dry = {}
for line in open("%s/pp_1f1b.dry" % work):
    m = re.search(r"predicted peak of pipeline stage (\d+): (\d+) bytes", line)
    if m:
        dry[int(m.group(1))] = int(m.group(2))
if sorted(dry) != [0, 1]:
    raise SystemExit("train --dry-run printed no peak for each stage")
# The dry run plans the flags' split: tools/plan's layout of that name.
searched = layout("act2", "tp1.pp2.dp1.cp1.z0.rnone.mb2.last1")["stage_memory"]
if any(abs(dry[s] - searched[s]) > 1 for s in (0, 1)):
    raise SystemExit("dry run %s != plan's last1 layout %s" % (dry, searched))
for rank, peak in enumerate(peaks("pp_1f1b")):
    check("pp_1f1b 3|1 rank %d (dry run)" % rank, peak, dry[rank])
for run, name in (("pp_interleaved", "tp1.pp2v2.dp1.cp1.z0.rnone.mb2"),
                  ("pp_zb", "tp1.pp2.dp1.cp1.z0.rnone.mb2.szb-h1.last1"),
                  ("pp_zbv", "tp1.pp2v2.dp1.cp1.z0.rnone.mb2.szbv")):
    stages = layout("act2", name)["stage_memory"]
    for rank, peak in enumerate(peaks(run)):
        check("%s rank %d" % (run, rank), peak, int(stages[rank]))
# ZB-H1's last stage holds more than 1F1B's, as predicted.
zb_growth = peaks("pp_zb")[1] - peaks("pp_1f1b")[1]
predicted_growth = (layout("act2", "tp1.pp2.dp1.cp1.z0.rnone.mb2.szb-h1.last1")
                    ["stage_memory"][1] - dry[1])
check("ZB-H1's last stage beyond 1F1B's", zb_growth, int(predicted_growth))
hsdp = layout("state4", "tp1.pp1.dp4.cp1.z1.rnone.mb1.i2")
for rank, peak in enumerate(peaks("hsdp")):
    check("HSDP 2 x DP 2 rank %d" % rank, peak, int(hsdp["memory"]["total"]))
lowered = layout("lowered2", "tp1.pp1.dp2.cp1.z1.rnone.mb1")
for rank, peak in enumerate(peaks("moments_bf16")):
    check("bf16 moments rank %d" % rank, peak, int(lowered["memory"]["total"]))
# bf16 moments hold half of fp32's state: the saving is the bf16 state.
saved = peaks("moments_fp32")[0] - peaks("moments_bf16")[0]
check("bytes bf16 moments save", saved,
      int(lowered["memory"]["optimizer_state"]))
if failed:
    raise SystemExit("off by more than 10%: " + ", ".join(failed))
print("plan memory within 10% of every measured rank")
PY
