#!/usr/bin/env bash
# The planner against measured runs: the bench preset in 2 processes under
# several layouts; rank 0's peak memory (train's allocator, the metrics file)
# and mean step time of the last iterations beside tools/plan's prediction
# for the same layout (pipeline stage 0, --device cpu measured at start) and
# Megatron's theoretical_memory_usage, as a Markdown table.
#   tools/bazel run //tools/bench:plan_check -- [--iters N]
set -euo pipefail
launch=$1
train=$2
plan=$3
shift 3
iters=4
[[ "${1:-}" == "--iters" ]] && iters=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--preset bench --global-batch-size 8 --micro-batch-size 2
        --train-iters "$iters" --log-interval 1 --num-threads 1)

# name | planner layout | train flags
layouts=(
  "DP 2|tp1.pp1.dp2.z0.rnone.mb2|"
  "DP 2, ZeRO-1|tp1.pp1.dp2.z1.rnone.mb2|--use-distributed-optimizer"
  "DP 2, ZeRO-2|tp1.pp1.dp2.z2.rnone.mb2|--data-parallel-sharding-strategy optim_grads"
  "DP 2, ZeRO-3|tp1.pp1.dp2.z3.rnone.mb2|--data-parallel-sharding-strategy optim_grads_params"
  "DP 2, selective recompute|tp1.pp1.dp2.z0.rselective.mb2|--recompute-granularity selective"
  "DP 2, full recompute|tp1.pp1.dp2.z0.rfull.mb2|--recompute-granularity full"
  "TP 2 + SP|tp2sp.pp1.dp1.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel"
  "PP 2, 1F1B|tp1.pp2.dp1.z0.rnone.mb2|--pipeline-model-parallel-size 2"
  "PP 2, interleaved (3 virtual)|tp1.pp2v3.dp1.z0.rnone.mb2|--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"
  "DP 2, ZeRO-1, bf16|tp1.pp1.dp2.z1.rnone.mb2|--use-distributed-optimizer --bf16"
)

echo "| layout | measured peak (rank 0) | predicted | error | Megatron's formula | measured step | predicted step | error |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${layouts[@]}"; do
  IFS='|' read -r name layout flags <<< "$row"
  read -r -a extra <<< "$flags"
  bf16=()
  [[ " $flags " == *" --bf16 "* ]] && bf16=(--bf16)
  rm -f "$work/m.jsonl"  # train appends to its metrics file
  "$launch" --nproc_per_node 2 -- "$train" "${common[@]}" "${extra[@]}" \
    --metrics-file "$work/m.jsonl" > "$work/train.log" 2>&1 \
    || { tail -20 "$work/train.log"; exit 1; }
  "$plan" --preset bench --global-batch-size 8 --device cpu \
    --devices-per-node 2 "${bf16[@]}" --explain "$layout" --json > "$work/p.json"
  python3 - "$name" "$work/m.jsonl" "$work/p.json" <<'PY'
import json, sys
name, metrics, pred = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics)]
peak = max(r["mem_peak_bytes"] for r in rows)
steps = [r["seconds_per_iteration"] for r in rows[1:]] or [rows[0]["seconds_per_iteration"]]
step = sum(steps) / len(steps)
p = json.load(open(pred))["layouts"][0]
mem = p["stage_memory"][0]
t = p["time"]["total"]
meg = p["memory"]["megatron_theoretical"]
g = lambda b: "%.1f MiB" % (b / 2**20)
print("| %s | %s | %s | %+.1f%% | %s | %.2f s | %.2f s | %+.0f%% |" % (
    name, g(peak), g(mem), 100 * (mem - peak) / peak, g(meg), step, t,
    100 * (t - step) / step))
PY
done
