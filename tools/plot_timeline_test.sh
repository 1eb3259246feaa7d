#!/usr/bin/env bash
# plot_timeline.py draws a synthetic 1F1B schedule (2 stages, 4 micro-batches)
# and reports the bubble the schedule implies.
set -euo pipefail
plot="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
/usr/bin/python3 - "${dir}/trace.json" <<'PY'
import json, sys
# Unit-time forwards, two-unit backwards, 1F1B on 2 stages, 4 micro-batches.
sched = {0: [("F",0,0),("F",1,1),("B",0,3),("F",2,5),("B",1,7),("F",3,9),("B",2,11),("B",3,15)],
         1: [("F",0,1),("B",0,2),("F",1,4),("B",1,5),("F",2,7),("B",2,8),("F",3,11),("B",3,12)]}
ev = []
for rank, items in sched.items():
    for kind, mb, t in items:
        ev.append({"name": ("forward" if kind == "F" else "backward"), "cat": "compute",
                   "ph": "X", "ts": t * 1000, "dur": (1 if kind == "F" else 2) * 1000,
                   "pid": rank, "tid": 0, "args": {"microbatch": str(mb)}})
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
PY
out="$(/usr/bin/python3 "${plot}" "${dir}/trace.json" "${dir}/schedule.png")"
echo "${out}"
# Each stage is busy 12 of its span: stage 0 spans 17 units, stage 1 spans 13.
grep -q "rank 0: busy 12.00 ms of 17.00 ms, bubble 29.4%" <<<"${out}"
grep -q "rank 1: busy 12.00 ms of 13.00 ms, bubble 7.7%" <<<"${out}"
test "$(head -c 8 "${dir}/schedule.png" | od -An -c | tr -d ' ')" = '211PNG\r\n032\n'
# With the schedule's own span (train's "pipeline schedule" events, 20 units
# on rank 0), the bubble is measured against it, as train logs it.
/usr/bin/python3 - "${dir}/trace.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["traceEvents"].append({"name": "pipeline schedule", "cat": "schedule", "ph": "X",
                           "ts": 0, "dur": 20000, "pid": 0, "tid": 0, "args": {}})
json.dump(doc, open(sys.argv[1], "w"))
PY
out="$(/usr/bin/python3 "${plot}" "${dir}/trace.json" "${dir}/schedule.png")"
echo "${out}"
grep -q "rank 0: busy 12.00 ms of 20.00 ms, bubble 40.0%" <<<"${out}"
grep -q "rank 1: busy 12.00 ms of 13.00 ms, bubble 7.7%" <<<"${out}"
# With each box's CPU time ("cpu_us"), the step is replayed on CPU time:
# 1F1B's (m + P - 1)(F + B) = 15 units, each stage busy 12 (20% bubble),
# even when rank 0's boxes took twice as long waiting for a core.
/usr/bin/python3 - "${dir}/trace.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for e in doc["traceEvents"]:
    if e["cat"] == "compute":
        e["args"]["cpu_us"] = str(e["dur"])
        if e["pid"] == 0:
            e["dur"] *= 2
json.dump(doc, open(sys.argv[1], "w"))
PY
out="$(/usr/bin/python3 "${plot}" "${dir}/trace.json" "${dir}/schedule.png")"
echo "${out}"
grep -q "rank 0: CPU busy 12.00 ms a step (50% of its boxes' wall time), replayed step 15.00 ms, CPU-time bubble 20.0%" <<<"${out}"
grep -q "rank 1: CPU busy 12.00 ms a step (100% of its boxes' wall time), replayed step 15.00 ms, CPU-time bubble 20.0%" <<<"${out}"
# --cpu-replay draws that replay, with the same figures.
rm -f "${dir}/replay.png"
out="$(/usr/bin/python3 "${plot}" "${dir}/trace.json" "${dir}/replay.png" --cpu-replay)"
grep -q "CPU-time bubble 20.0%" <<<"${out}"
test "$(head -c 8 "${dir}/replay.png" | od -An -c | tr -d ' ')" = '211PNG\r\n032\n'
echo PASS
