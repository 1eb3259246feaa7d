#!/usr/bin/env bash
# The planner against measured runs: the bench preset in 2 processes under
# several layouts; rank 0's peak memory (train's allocator, the metrics file)
# and mean step time of the last iterations beside tools/plan's prediction
# for the same layout (pipeline stage 0, --device cpu measured at start) and
# Megatron's theoretical_memory_usage, as a Markdown table.
#   tools/bazel run //tools/bench:plan_check -- [--iters N] [--procs 2|4]
#       [--only NAME]
# --procs 4 runs the 4-process list (TP x DP, PP x DP, TP x PP, ZeRO over 4,
# PP 4 1F1B and interleaved on an 8-layer bench model); --only runs the one
# layout whose name starts with NAME (a smoke check).
set -euo pipefail
launch=$1
train=$2
plan=$3
shift 3
iters=4
procs=2
only=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "plan_check: unknown argument '$1' (--iters N, --procs 2|4, --only NAME)" >&2
       exit 2 ;;
  esac
done
if [[ "$procs" != 2 && "$procs" != 4 ]]; then
  echo "plan_check: --procs $procs: the lists are for 2 or 4 processes" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--preset bench --global-batch-size 8 --micro-batch-size 2
        --train-iters "$iters" --log-interval 1 --num-threads 1)

# name | planner layout | train flags [| model flags, to train and plan]
layouts2=(
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
layouts4=(
  "DP 4|tp1.pp1.dp4.z0.rnone.mb2|"
  "DP 4, ZeRO-1|tp1.pp1.dp4.z1.rnone.mb2|--use-distributed-optimizer"
  "DP 4, ZeRO-3|tp1.pp1.dp4.z3.rnone.mb2|--data-parallel-sharding-strategy optim_grads_params"
  "DP 4, full recompute|tp1.pp1.dp4.z0.rfull.mb2|--recompute-granularity full"
  "TP 2 + SP x DP 2|tp2sp.pp1.dp2.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel"
  "TP 2 + SP x DP 2, ZeRO-1, bf16|tp2sp.pp1.dp2.z1.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --bf16"
  "TP 4 + SP|tp4sp.pp1.dp1.z0.rnone.mb2|--tensor-model-parallel-size 4 --sequence-parallel"
  "PP 2 x DP 2, 1F1B|tp1.pp2.dp2.z0.rnone.mb2|--pipeline-model-parallel-size 2"
  "PP 2 x DP 2, interleaved (3 virtual)|tp1.pp2v3.dp2.z0.rnone.mb2|--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"
  "TP 2 + SP x PP 2|tp2sp.pp2.dp1.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2"
  "PP 4, 1F1B (8 layers)|tp1.pp4.dp1.z0.rnone.mb2|--pipeline-model-parallel-size 4|--num-layers 8"
  "PP 4, interleaved (2 virtual, 8 layers)|tp1.pp4v2.dp1.z0.rnone.mb2|--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1|--num-layers 8"
)
if [[ "$procs" == 4 ]]; then layouts=("${layouts4[@]}"); else layouts=("${layouts2[@]}"); fi

echo "| layout | measured peak (rank 0) | predicted | error | Megatron's formula | measured step | predicted step | error |"
echo "|---|---|---|---|---|---|---|---|"
ran=0
for row in "${layouts[@]}"; do
  IFS='|' read -r name layout flags model_flags <<< "$row"
  [[ -n "$only" && "$name" != "$only"* ]] && continue
  ran=$((ran + 1))
  read -r -a extra <<< "$flags"
  read -r -a model <<< "${model_flags:-}"
  bf16=()
  [[ " $flags " == *" --bf16 "* ]] && bf16=(--bf16)
  rm -f "$work/m.jsonl"  # train appends to its metrics file
  "$launch" --nproc_per_node "$procs" -- "$train" "${common[@]}" "${model[@]}" \
    "${extra[@]}" --metrics-file "$work/m.jsonl" > "$work/train.log" 2>&1 \
    || { tail -20 "$work/train.log"; exit 1; }
  "$plan" --preset bench --global-batch-size 8 "${model[@]}" --device cpu \
    --devices-per-node "$procs" "${bf16[@]}" --explain "$layout" --json > "$work/p.json"
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
if [[ "$ran" == 0 ]]; then
  echo "plan_check: --only '$only' names no layout of the $procs-process list" >&2
  exit 2
fi
