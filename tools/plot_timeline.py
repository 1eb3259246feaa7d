#!/usr/bin/python3
"""Draws a pipeline schedule from a merged trace (tools/merge_traces) as PNG.

Usage: /usr/bin/python3 tools/plot_timeline.py MERGED.json OUT.png [--step N]
           [--title TEXT] [--cpu-replay]

One row per rank (pipeline stage), one box per forward or backward of a
micro-batch (events of category "compute" whose args carry "microbatch"),
coloured by micro-batch: forwards light, backwards dark, split-off weight
gradients (zero-bubble schedules' W) mid-tone and dotted, so the bubbles are
the empty stretches; with virtual stages the label says the chunk ("F3.1")
and the second chunk's boxes are hatched. Prints each rank's busy time, span
and bubble fraction (1 - busy / span) over the plotted window; the span is
that of the "pipeline schedule" events (category "schedule", what train
logs as the schedule's time) when the trace has them, else from the first
box to the last.

When the boxes carry their CPU time (train's traces: "cpu_us"), it also
prints a bubble that a loaded machine does not distort: each step replayed
with every box taking its CPU time (at most its duration) and waiting only
for the boxes it depends on (F on the previous virtual stage's F, B on its
F and the next virtual stage's B, W on its B; transfers free), each rank's
CPU busy time against that replayed step; --cpu-replay draws that replay
instead of the measured times. Uses Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colormaps  # noqa: E402


def load_boxes(path, step):
    """Compute boxes and schedule spans (total microseconds) per rank."""
    with open(path) as f:
        doc = json.load(f)
    boxes, spans = {}, {}
    for e in doc.get("traceEvents", []):
        args = e.get("args") or {}
        if e.get("ph") != "X":
            continue
        if step is not None and str(args.get("step")) != str(step):
            continue
        if e.get("cat") == "schedule":
            spans[e["pid"]] = spans.get(e["pid"], 0.0) + float(e["dur"])
            continue
        if e.get("cat") != "compute" or "microbatch" not in args:
            continue
        dur = float(e["dur"])
        # The box's CPU time (train's traces carry "cpu_us", the thread's
        # CPU since its previous event), at most its duration.
        cpu = min(dur, float(args["cpu_us"])) if "cpu_us" in args else None
        boxes.setdefault(e["pid"], []).append(
            (float(e["ts"]), dur, int(args["microbatch"]),
             e["name"][0].upper() if e["name"][:1] in "bw" else "F",
             int(args.get("chunk", "0")),
             int(args.get("virtual_stage", e["pid"])), cpu,
             str(args.get("step"))))
    return boxes, spans


def replay_step(boxes, starts=None):
    """One step's boxes run again, each rank in its own order, each box
    taking its CPU time and waiting, as the executor does, for what it
    depends on: F for the forward on the virtual stage before, B for its F
    and the backward on the stage after, W for its B; transfers free.
    Returns the makespan (microseconds), or None when the boxes do not
    follow those dependencies; each box's replayed start goes to
    starts[(rank, box)] when given."""
    last_stage = max(b[5] for rank in boxes.values() for b in rank)
    order = {r: sorted(bs) for r, bs in boxes.items()}
    nxt = {r: 0 for r in order}
    free = {r: 0.0 for r in order}
    done = {}
    remaining = sum(len(bs) for bs in order.values())
    while remaining:
        progressed = False
        for r, bs in order.items():
            while nxt[r] < len(bs):
                _, _, mb, kind, _, vs, cpu, _ = bs[nxt[r]]
                need = []
                if kind == "F" and vs > 0:
                    need.append(("F", mb, vs - 1))
                if kind == "B":
                    need.append(("F", mb, vs))
                    if vs < last_stage:
                        need.append(("B", mb, vs + 1))
                if kind == "W":
                    need.append(("B", mb, vs))
                if any(n not in done for n in need):
                    break
                start = max([free[r]] + [done[n] for n in need])
                if starts is not None:
                    starts[(r, bs[nxt[r]])] = start
                free[r] = start + cpu
                done[(kind, mb, vs)] = free[r]
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            return None
    return max(free.values())


def replay(boxes, starts=None):
    """Per step (its own fill and drain: steps are separated by the
    gradient reduction and the optimizer), the replayed makespan; returns
    the mean makespan and each rank's mean CPU busy time per step, or None
    when a box has no CPU time or a step does not replay. Each box's start
    on the replayed steps laid end to end goes to starts[(rank, box)]."""
    if any(b[6] is None for rank in boxes.values() for b in rank):
        return None
    steps = sorted({b[7] for rank in boxes.values() for b in rank})
    makespan = 0.0
    for st in steps:
        one = {r: [b for b in bs if b[7] == st] for r, bs in boxes.items()}
        step_starts = {}
        m = replay_step({r: bs for r, bs in one.items() if bs}, step_starts)
        if m is None:
            return None
        if starts is not None:
            for key, start in step_starts.items():
                starts[key] = makespan + start
        makespan += m
    busy = {r: sum(b[6] for b in bs) / len(steps) for r, bs in boxes.items()}
    return makespan / len(steps), busy, len(steps)


def bubble(boxes, span=None):
    if span is None:
        span = max(b[0] + b[1] for b in boxes) - min(b[0] for b in boxes)
    busy = sum(b[1] for b in boxes)
    return busy, span, 1.0 - busy / span if span > 0 else 0.0


def main():
    args = sys.argv[1:]
    step = None
    title = "pipeline schedule"
    if "--step" in args:
        i = args.index("--step")
        step = args[i + 1]
        del args[i:i + 2]
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i:i + 2]
    cpu_replay = "--cpu-replay" in args
    if cpu_replay:
        args.remove("--cpu-replay")
    if len(args) != 2:
        sys.exit(__doc__)
    trace, png = args
    boxes, spans = load_boxes(trace, step)
    if not boxes:
        sys.exit(f"{trace}: no compute events with a microbatch argument")
    measured = boxes
    if cpu_replay:
        # Draw the replay: each box at its replayed start, its CPU time long.
        starts = {}
        if replay(boxes, starts) is None:
            sys.exit(f"{trace}: --cpu-replay needs every box's cpu_us and "
                     "the executor's dependencies")
        boxes = {r: [(starts[(r, b)], b[6]) + b[2:] for b in bs]
                 for r, bs in boxes.items()}
    t0 = min(b[0] for rank in boxes.values() for b in rank)
    n_mb = 1 + max(b[2] for rank in boxes.values() for b in rank)
    cmap = colormaps["tab10"] if n_mb <= 10 else colormaps["tab20"]
    chunks = 1 + max(b[4] for rank in boxes.values() for b in rank)
    ranks = sorted(boxes)
    # Labels only where they fit (a hundredth of the plotted span).
    t1 = max(b[0] + b[1] for rank in boxes.values() for b in rank)
    min_label = (t1 - t0) / 100.0
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(ranks) + 1.2), dpi=100)
    for row, rank in enumerate(ranks):
        for ts, dur, mb, kind, chunk, *_ in boxes[rank]:
            colour = cmap(mb % cmap.N)
            alpha = {"F": 0.45, "B": 1.0, "W": 0.75}[kind]
            hatch = "//" if chunk % 2 else ("..." if kind == "W" else None)
            ax.broken_barh([((ts - t0) / 1000.0, dur / 1000.0)], (row - 0.4, 0.8),
                           facecolors=colour, alpha=alpha,
                           edgecolor="black", linewidth=0.3, hatch=hatch)
            label = kind + str(mb)
            if chunks > 1:
                label += "." + str(chunk)
            if dur >= min_label:
                ax.text((ts - t0 + dur / 2) / 1000.0, row, label,
                        ha="center", va="center", fontsize=6)
        busy, span, frac = bubble(measured[rank], spans.get(rank))
        print(f"rank {rank}: busy {busy / 1000:.2f} ms of {span / 1000:.2f} ms,"
              f" bubble {100 * frac:.1f}%")
    # Weighed by CPU time: a loaded machine's waits for a core drop out.
    replayed = replay(measured)
    if replayed is not None:
        makespan, busy, steps = replayed
        for rank in ranks:
            wall = sum(b[1] for b in measured[rank]) / steps
            print(f"rank {rank}: CPU busy {busy[rank] / 1000:.2f} ms a step "
                  f"({100 * busy[rank] / max(wall, 1e-9):.0f}% of its boxes' "
                  f"wall time), replayed step {makespan / 1000:.2f} ms, "
                  f"CPU-time bubble {100 * (1 - busy[rank] / makespan):.1f}%")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"stage {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(("CPU-time replay (ms)" if cpu_replay else "time (ms)") +
                  "; light: forward, dark: backward, dotted: weight gradient")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
