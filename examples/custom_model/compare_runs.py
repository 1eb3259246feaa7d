"""Compares a parallel run of train_tiny_lm with the serial run.

Usage: compare_runs.py SERIAL_FILE PARALLEL_FILE...

Each file holds "loss STEP VALUE" and "param NAME COUNT VALUES..." lines.
The parallel files together must hold every loss and parameter of the serial
run, each within 1e-5 (relative, absolute below magnitude 1).

Error bound: a layout sums the same fp32 gradients in another order
(per-rank sums, then the reduction), which moves each gradient element by a
few ulp (~1e-7 relative); SGD with momentum carries that into parameter
differences of the same relative size per step, so after a handful of steps
losses and parameters agree to about 1e-6.
"""
import sys

TOLERANCE = 1e-5


def read(paths):
    losses, params = {}, {}
    for path in paths:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if fields[0] == "loss":
                    losses[int(fields[1])] = float(fields[2])
                elif fields[0] == "param":
                    params[fields[1]] = [float(v) for v in fields[3:]]
    return losses, params


def close(a, b):
    return abs(a - b) <= TOLERANCE * max(1.0, abs(b))


def main():
    serial_losses, serial_params = read(sys.argv[1:2])
    losses, params = read(sys.argv[2:])
    failures = []
    worst_loss = worst_param = 0.0
    for i, expected in sorted(serial_losses.items()):
        if i not in losses:
            failures.append(f"loss {i} missing")
            continue
        worst_loss = max(worst_loss, abs(losses[i] - expected))
        if not close(losses[i], expected):
            failures.append(f"loss {i}: {losses[i]} vs serial {expected}")
    for name, expected in sorted(serial_params.items()):
        got = params.get(name)
        if got is None or len(got) != len(expected):
            failures.append(f"parameter {name} missing or of another size")
            continue
        for j, (g, e) in enumerate(zip(got, expected)):
            worst_param = max(worst_param, abs(g - e))
            if not close(g, e):
                failures.append(f"{name}[{j}]: {g} vs serial {e}")
                break
    if set(params) != set(serial_params):
        failures.append(f"parameters differ: {sorted(set(params) ^ set(serial_params))}")
    # Training moved the model: the comparison is not between initial states.
    steps = sorted(serial_losses)
    first = [serial_losses[i] for i in steps[:4]]
    last = [serial_losses[i] for i in steps[-4:]]
    if not sum(last) < 0.9 * sum(first):
        failures.append(f"the serial loss did not fall: {first} -> {last}")
    print(f"worst loss difference {worst_loss:.3g}, "
          f"parameter difference {worst_param:.3g}")
    for f in failures[:10]:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
