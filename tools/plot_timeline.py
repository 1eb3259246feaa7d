#!/usr/bin/python3
"""Draws a pipeline schedule from a merged trace (tools/merge_traces) as PNG.

Usage: /usr/bin/python3 tools/plot_timeline.py MERGED.json OUT.png [--step N]

One row per rank (pipeline stage), one box per forward or backward of a
micro-batch (events of category "compute" whose args carry "microbatch"),
coloured by micro-batch: forwards light, backwards dark, so the bubbles are
the empty stretches. Prints each rank's busy time, span and bubble fraction
(1 - busy / span) over the plotted window. Uses Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colormaps  # noqa: E402


def load_boxes(path, step):
    with open(path) as f:
        doc = json.load(f)
    boxes = {}
    for e in doc.get("traceEvents", []):
        args = e.get("args") or {}
        if e.get("ph") != "X" or e.get("cat") != "compute":
            continue
        if "microbatch" not in args:
            continue
        if step is not None and str(args.get("step")) != str(step):
            continue
        boxes.setdefault(e["pid"], []).append(
            (float(e["ts"]), float(e["dur"]), int(args["microbatch"]),
             e["name"].startswith("backward"), args.get("chunk", "0")))
    return boxes


def bubble(boxes):
    start = min(b[0] for b in boxes)
    end = max(b[0] + b[1] for b in boxes)
    busy = sum(b[1] for b in boxes)
    return busy, end - start, 1.0 - busy / (end - start) if end > start else 0.0


def main():
    args = sys.argv[1:]
    step = None
    if "--step" in args:
        i = args.index("--step")
        step = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    trace, png = args
    boxes = load_boxes(trace, step)
    if not boxes:
        sys.exit(f"{trace}: no compute events with a microbatch argument")
    t0 = min(b[0] for rank in boxes.values() for b in rank)
    n_mb = 1 + max(b[2] for rank in boxes.values() for b in rank)
    cmap = colormaps["tab10"] if n_mb <= 10 else colormaps["tab20"]
    ranks = sorted(boxes)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(ranks) + 1.2), dpi=100)
    for row, rank in enumerate(ranks):
        for ts, dur, mb, backward, chunk in boxes[rank]:
            colour = cmap(mb % cmap.N)
            ax.broken_barh([((ts - t0) / 1000.0, dur / 1000.0)], (row - 0.4, 0.8),
                           facecolors=colour, alpha=1.0 if backward else 0.45,
                           edgecolor="black", linewidth=0.3)
            ax.text((ts - t0 + dur / 2) / 1000.0, row,
                    ("B" if backward else "F") + str(mb), ha="center",
                    va="center", fontsize=6)
        busy, span, frac = bubble(boxes[rank])
        print(f"rank {rank}: busy {busy / 1000:.2f} ms of {span / 1000:.2f} ms,"
              f" bubble {100 * frac:.1f}%")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"stage {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms); light: forward, dark: backward")
    ax.set_title("pipeline schedule")
    fig.tight_layout()
    fig.savefig(png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
