#!/usr/bin/env bash
# tools/plan and train --dry-run end to end: the ranked table, --json,
# --explain, errors naming the flag, and train --dry-run predicting the same
# memory as plan for the same layout, exiting 1 (with a warning) when a rank
# will not fit, before allocating anything.
set -euo pipefail
plan=$1
train=$2
work=${TEST_TMPDIR:-$(mktemp -d)}

# The shipped table: the bench preset on one node of 4 H100s.
"$plan" --preset bench --global-batch-size 16 --device h100 \
  --devices-per-node 4 --top 5 > "$work/table.txt"
cat "$work/table.txt"
[[ $(grep -c '^[0-9]' "$work/table.txt") == 5 ]]

# JSON: every layout on 4 devices, fitting, sorted by predicted step time.
"$plan" --preset bench --global-batch-size 16 --device h100 \
  --devices-per-node 2 --nnodes 2 --top 50 --json > "$work/plan.json"
python3 - "$work/plan.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ls = j["layouts"]
assert len(ls) > 5, len(ls)
assert j["cluster"]["nodes"] == 2 and j["cluster"]["devices_per_node"] == 2
times = [l["time"]["total"] for l in ls]
assert times == sorted(times), times
for l in ls:
    assert l["fits"] and l["unsupported"] == "", l["layout"]
    m = l["memory"]
    parts = sum(m[k] for k in ("weights", "gradients", "main_weights",
        "optimizer_state", "activations", "comm_buffers", "workspace",
        "input_batches", "allocator_overhead"))
    assert abs(parts - m["total"]) <= 1e-6 * m["total"], l["layout"]
    assert 0 < l["mfu"] < 1, l["layout"]
print("json OK:", len(ls), "layouts")
PY

# --explain names every part.
"$plan" --preset bench --global-batch-size 16 --device a100 \
  --devices-per-node 4 --explain tp2sp.pp2v3.dp1.z1.rselective.mb2 \
  > "$work/explain.txt"
cat "$work/explain.txt"
for part in weights gradients "main weights" "optimizer state" activations \
    "comm buffers" workspace "input batches" "allocator overhead" \
    "Megatron's estimate" \
    GEMMs "TP communication" "DP communication" "PP communication" \
    "pipeline bubble" optimizer MFU; do
  grep -q "$part" "$work/explain.txt" || { echo "no '$part'"; exit 1; }
done

# Errors name the flag and exit 2.
set +e
"$plan" --preset bench --global-batch-size 16 --device tpu 2> "$work/err.txt"
code=$?
set -e
[[ $code == 2 ]] && grep -q -- "--device 'tpu'" "$work/err.txt"

# train --dry-run and plan predict the same memory for the same layout.
"$train" --preset bench --dry-run > "$work/dry.txt"
"$plan" --preset bench --global-batch-size 4 --device cpu \
  --explain tp1.pp1.dp1.z0.rnone.mb4 > "$work/same.txt"
diff <(grep -A9 '^memory' "$work/dry.txt") <(grep -A9 '^memory' "$work/same.txt")

# GPT-3 175B on one CPU rank does not fit: a warning, exit 1, at once.
set +e
timeout 60 "$train" --mock-data --vocab-size 50257 --num-layers 96 \
  --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \
  --micro-batch-size 1 --dry-run > "$work/big.txt" 2> "$work/big.err"
code=$?
set -e
cat "$work/big.err"
[[ $code == 1 ]] && grep -q "will not fit" "$work/big.err"
grep -q "DOES NOT FIT" "$work/big.txt"
echo "plan and train --dry-run OK"
