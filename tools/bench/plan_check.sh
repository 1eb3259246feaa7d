#!/usr/bin/env bash
# The planner against measured runs: the bench preset in 2 processes under
# several layouts; rank 0's peak memory (train's allocator, the metrics file)
# and median step time of the iterations after the first two beside
# tools/plan's prediction for the same layout (pipeline stage 0, --device cpu
# measured at start) and Megatron's theoretical_memory_usage, as a Markdown
# table, with the hypervisor's steal time during each run (a VM neighbour's load)
# and how far each of the planner's probes drifted (DeviceSpec::probe_drift:
# its shaped GEMM's readings at the start, middle and end; over 20%, another
# load shared the machine while it measured).
#   tools/bazel run //tools/bench:plan_check -- [--iters N] [--procs 2|4]
#       [--repeats N] [--only NAME] [--no-recommend] [--rounds N]
# --procs 4 runs the 4-process list (TP x DP, PP x DP, TP x PP, ZeRO over 4,
# PP 4 1F1B and interleaved on an 8-layer bench model, CP with DP and TP);
# both lists also run the small Llama (--preset llama-small in the model
# flags, which come after --preset bench); --only runs the one
# layout whose name starts with NAME (a smoke check). Without --only it ends
# with the recommendation check: the layout tools/plan ranks first (measured
# too when it is not in the list) against the fastest measured, then the two
# again in --rounds (default 3) alternating pairs, whose medians the goal
# reads.
# --repeats N measures the whole list N times, one pass after another (so a
# slow minute of the VM lands on different layouts in each pass), and
# reports each layout's median step and median prediction, with every
# pass's step beside them: with more ranks than cores one run is a sample.
# --records FILE keeps every run's record, with the probe's figures
# (tools/plan --json's cluster), as JSON lines: an outlying prediction can
# then be traced to the figure that moved.
set -euo pipefail
launch=$1
train=$2
plan=$3
shift 3
iters=8
procs=2
repeats=1
only=""
recommend=1
rounds=3
keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-recommend) recommend=0; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --records) keep=$2; shift 2 ;;
    *) echo "plan_check: unknown argument '$1' (--iters N, --procs 2|4, --repeats N, --only NAME, --no-recommend, --rounds N, --records FILE)" >&2
       exit 2 ;;
  esac
done
# require_count FLAG VALUE: exits 2 unless VALUE is a positive count.
require_count() {
  if ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
    echo "plan_check: --$1 $2: a positive count" >&2
    exit 2
  fi
}
require_count repeats "$repeats"
require_count rounds "$rounds"
if [[ "$procs" != 2 && "$procs" != 4 ]]; then
  echo "plan_check: --procs $procs: the lists are for 2 or 4 processes" >&2
  exit 2
fi
work=$(mktemp -d)
# --records: the list's and the paired runs' records, kept at exit (a
# relative path is from where `bazel run` was called).
[[ -n "$keep" && "$keep" != /* ]] && keep="${BUILD_WORKING_DIRECTORY:-$PWD}/$keep"
keep_records() {
  [[ -z "$keep" ]] || cat "$work"/records.jsonl "$work"/paired.jsonl \
    > "$keep" 2> /dev/null || true
}
trap 'keep_records; rm -rf "$work"' EXIT
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
  "CP 2 (ring)|tp1.pp1.dp1.cp2.z0.rnone.mb2|--context-parallel-size 2"
  "Llama small, DP 2|tp1.pp1.dp2.z0.rnone.mb2||--preset llama-small"
  "Llama small, TP 2 + SP|tp2sp.pp1.dp1.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel|--preset llama-small"
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
  "CP 2 x DP 2|tp1.pp1.dp2.cp2.z0.rnone.mb2|--context-parallel-size 2"
  "TP 2 + SP x CP 2|tp2sp.pp1.dp1.cp2.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size 2"
  "CP 4, ZeRO-1|tp1.pp1.dp1.cp4.z1.rnone.mb2|--context-parallel-size 4 --use-distributed-optimizer"
  "Llama small, TP 2 + SP x DP 2|tp2sp.pp1.dp2.z0.rnone.mb2|--tensor-model-parallel-size 2 --sequence-parallel|--preset llama-small"
)
if [[ "$procs" == 4 ]]; then layouts=("${layouts4[@]}"); else layouts=("${layouts2[@]}"); fi

# flags_of LAYOUT [MODEL_FLAGS...]: train flags for a planner layout name.
flags_of() {
  python3 - "$@" <<'PY'
import re, sys
name, model = sys.argv[1], sys.argv[2:]
layers = 8 if "--num-layers" in model and model[model.index("--num-layers") + 1] == "8" else 6
out = []
for part in name.split("."):
    m = re.fullmatch(r"tp(\d+)(sp)?", part)
    if m:
        if int(m[1]) > 1:
            out += ["--tensor-model-parallel-size", m[1]]
        if m[2]:
            out += ["--sequence-parallel"]
        continue
    m = re.fullmatch(r"pp(\d+)(?:v(\d+))?", part)
    if m:
        if int(m[1]) > 1:
            out += ["--pipeline-model-parallel-size", m[1]]
        if m[2] and int(m[2]) > 1:
            out += ["--num-layers-per-virtual-pipeline-stage",
                    str(layers // int(m[1]) // int(m[2]))]
        continue
    m = re.fullmatch(r"cp(\d+)", part)
    if m and int(m[1]) > 1:
        out += ["--context-parallel-size", m[1]]
    if part == "z1":
        out += ["--use-distributed-optimizer"]
    if part in ("z2", "z3"):
        out += ["--data-parallel-sharding-strategy",
                {"z2": "optim_grads", "z3": "optim_grads_params"}[part]]
    if part in ("rselective", "rfull"):
        out += ["--recompute-granularity", part[1:]]
    m = re.fullmatch(r"mb(\d+)", part)
    if m:
        out += ["--micro-batch-size", m[1]]
print(" ".join(out))
PY
}

# The hypervisor's steal time (/proc/stat) over a run, as a share of the
# cores' time: a VM neighbour's load shows here, not in the run's figures.
steal_jiffies() { awk '/^cpu /{print $9}' /proc/stat; }
# measure NAME LAYOUT FLAGS MODEL_FLAGS [RECORDS]: one training run and the
# planner's prediction for it; appends a JSON record to RECORDS (default
# $work/records.jsonl) and a progress line to stderr.
measure() {
  local name=$1 layout=$2 flags=$3 model_flags=$4
  local records=${5:-$work/records.jsonl}
  read -r -a extra <<< "$flags"
  read -r -a model <<< "$model_flags"
  bf16=()
  [[ " $flags " == *" --bf16 "* ]] && bf16=(--bf16)
  rm -f "$work/m.jsonl"  # train appends to its metrics file
  local steal0 t0
  steal0=$(steal_jiffies)
  t0=$(date +%s.%N)
  "$launch" --nproc_per_node "$procs" -- "$train" "${common[@]}" "${model[@]}" \
    "${extra[@]}" --metrics-file "$work/m.jsonl" > "$work/train.log" 2>&1 \
    || { tail -20 "$work/train.log"; exit 1; }
  local steal
  steal=$(python3 -c "import os,sys; s0,s1,t0,t1=map(float,sys.argv[1:]); print('%.1f%%' % (100*(s1-s0)/os.sysconf('SC_CLK_TCK')/os.cpu_count()/max(1e-9,t1-t0)))" \
    "$steal0" "$(steal_jiffies)" "$t0" "$(date +%s.%N)")
  # The planner probes the machine: let the run's exit (freeing its memory)
  # finish first, as a job is planned on a quiet machine.
  sleep 3
  "$plan" --preset bench --global-batch-size 8 "${model[@]}" --device cpu \
    --devices-per-node "$procs" "${bf16[@]}" --explain "$layout" --json > "$work/p.json"
  python3 - "$name" "$work/m.jsonl" "$work/p.json" "$layout" "$records" "$steal" <<'PY'
import json, sys
name, metrics, pred, layout, records, steal = sys.argv[1:]
rows = [json.loads(l) for l in open(metrics)]
# The steady state: the median of the iterations after the first two (the
# first maps memory and builds kernels; the second still took up to 40%
# longer than the rest in some runs).
steps = sorted(r["seconds_per_iteration"] for r in rows[2:]) or [rows[-1]["seconds_per_iteration"]]
plan = json.load(open(pred))
p = plan["layouts"][0]
rec = dict(name=name, layout=layout,
           peak=max(r["mem_peak_bytes"] for r in rows),
           mem=p["stage_memory"][0], meg=p["memory"]["megatron_theoretical"],
           step=steps[len(steps) // 2], pred=p["time"]["total"],
           steal=float(steal.rstrip("%")),
           probe=plan["cluster"])
with open(records, "a") as f:
    f.write(json.dumps(rec) + "\n")
print("%s: measured %.2f s, predicted %.2f s, steal %s, probe drift %.1f%%" % (
    name, rec["step"], rec["pred"], steal,
    100 * rec["probe"].get("probe_drift", 0)), file=sys.stderr)
PY
}

# report [RECORDS]: the table over every record, one row per
# layout name: medians over the passes, every pass's step, the largest steal.
report() {
  python3 - "${1:-$work/records.jsonl}" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
names = list(dict.fromkeys(r["name"] for r in recs))
g = lambda b: "%.1f MiB" % (b / 2**20)
print("| layout | measured peak (rank 0) | predicted | error | Megatron's formula | measured step | predicted step | error | runs | steal | probe drift |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    rs = [r for r in recs if r["name"] == n]
    peak = max(r["peak"] for r in rs)
    mem = statistics.median(r["mem"] for r in rs)
    step = statistics.median(r["step"] for r in rs)
    t = statistics.median(r["pred"] for r in rs)
    print("| %s | %s | %s | %+.1f%% | %s | %.2f s | %.2f s | %+.0f%% | %s | %.1f%% | %s |" % (
        n, g(peak), g(mem), 100 * (mem - peak) / peak, g(rs[0]["meg"]), step, t,
        100 * (t - step) / step, ", ".join("%.2f" % r["step"] for r in rs),
        max(r["steal"] for r in rs),
        ", ".join("%.0f%%" % (100 * r["probe"].get("probe_drift", 0))
                  for r in rs)))
PY
}

ran=0
: > "$work/records.jsonl"
for ((pass = 1; pass <= repeats; pass++)); do
  [[ "$repeats" -gt 1 ]] && echo "pass $pass of $repeats" >&2
  for row in "${layouts[@]}"; do
    IFS='|' read -r name layout flags model_flags <<< "$row"
    [[ -n "$only" && "$name" != "$only"* ]] && continue
    ran=$((ran + 1))
    measure "$name" "$layout" "$flags" "${model_flags:-}"
  done
done
if [[ "$ran" == 0 ]]; then
  echo "plan_check: --only '$only' names no layout of the $procs-process list" >&2
  exit 2
fi
if [[ -n "$only" || "$recommend" == 0 ]]; then
  report
  exit 0
fi

# The recommendation: the layout tools/plan ranks first for the bench preset
# on these processes (micro-batches 1 to 8, fp32, the bench model), measured
# beside the fastest bench-model layout measured above (Llama and 8-layer
# rows excluded: another model).
top=$("$plan" --preset bench --global-batch-size 8 --device cpu \
  --devices-per-node "$procs" --micro-batches 1,2,4,8 --top 1 --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["layouts"][0]["layout"])')
if ! grep -q "\"layout\": \"$top\"" "$work/records.jsonl"; then
  for ((pass = 1; pass <= repeats; pass++)); do
    measure "planner's first: $top" "$top" "$(flags_of "$top")" ""
  done
fi
report
python3 - "$top" "$work/records.jsonl" <<'PY'
import json, statistics, sys
top, path = sys.argv[1:]
recs = [json.loads(l) for l in open(path)]
# Each layout's median step over the passes (bench model, fp32 only).
by_name = {}
for r in recs:
    if "Llama" in r["name"] or "8 layers" in r["name"] or "bf16" in r["name"]:
        continue
    by_name.setdefault((r["name"], r["layout"]), []).append(r["step"])
bench = [(statistics.median(s), lay, n) for (n, lay), s in by_name.items()]
mine = min(s for s, lay, n in bench if lay == top)
best = min(bench)
print()
print("Recommendation: tools/plan ranks %s first; measured %.2f s per step; the "
      "fastest measured bench layout is %s (%s) at %.2f s: %+.1f%%."
      % (top, mine, best[1], best[2], best[0], 100 * (mine - best[0]) / best[0]))
with open(path + ".fastest", "w") as f:
    f.write("%s|%s\n" % (best[2], best[1]))
PY

# The fastest of a list of noisy medians is biased low (the least of many
# samples), and the two layouts ran minutes apart. So the planner's first and
# the fastest measured run again, alternating, --rounds times each, and the
# goal is read from the medians of these paired runs.
IFS='|' read -r fast_name fast_layout < "$work/records.jsonl.fastest"
if [[ "$fast_layout" == "$top" ]]; then
  echo "The planner's first is the fastest measured layout: +0.0% (goal: within 5%)."
  exit 0
fi
# The fastest is a bench-model fp32 layout: its name gives its flags.
fast_flags=$(flags_of "$fast_layout")
: > "$work/paired.jsonl"
for ((round = 1; round <= rounds; round++)); do
  echo "paired round $round of $rounds" >&2
  measure "planner's first: $top" "$top" "$(flags_of "$top")" "" "$work/paired.jsonl"
  measure "$fast_name" "$fast_layout" "$fast_flags" "" "$work/paired.jsonl"
done
echo
echo "Paired runs, alternating (--rounds $rounds):"
echo
report "$work/paired.jsonl"
python3 - "$top" "$fast_layout" "$work/paired.jsonl" <<'PY'
import json, statistics, sys
top, fast, path = sys.argv[1:]
recs = [json.loads(l) for l in open(path)]
mine = statistics.median(r["step"] for r in recs if r["layout"] == top)
best = statistics.median(r["step"] for r in recs if r["layout"] == fast)
print()
print("Recommendation, paired: %s %.2f s against %s %.2f s: %+.1f%% (goal: "
      "within 5%%)." % (top, mine, fast, best, 100 * (mine - best) / best))
PY
