#!/usr/bin/python3
"""Draws the loss curve of a --metrics-file (one JSON object per line) to PNG.

Usage: /usr/bin/python3 tools/plot_loss.py METRICS.jsonl OUT.png
Uses Debian's python3-matplotlib (run it with /usr/bin/python3).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(metrics_path, png_path):
    iterations, losses = [], []
    with open(metrics_path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            iterations.append(record["iteration"])
            losses.append(record["loss"])
    if not iterations:
        sys.exit(f"{metrics_path}: no metrics lines")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(iterations, losses, marker=".", linewidth=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title("loss curve: " + metrics_path.rsplit("/", 1)[-1])
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
