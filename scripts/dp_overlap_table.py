#!/usr/bin/env python3
"""The overlap table of bench/results/history-parallel.md from scripts/run_dp_experiments.sh's
overlap runs: rank 0's metrics, steps FIRST..last, p25 / median / p75 of the
step and of each exposed-communication field, for overlap off and on, and
the fraction of the exposed transfer that overlap hides.

    scripts/dp_overlap_table.py [RUN_DIR=runs/dp] [FIRST=6] [LABEL=1]
"""
import json
import statistics
import sys


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def load(path, first):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    return [r for r in rows if r.get("step", 0) >= first and "exposed_transfer_ms" in r]


def main():
    run_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/dp"
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    label = sys.argv[3] if len(sys.argv) > 3 else "1"
    med = {}
    for ov in ("false", "true"):
        rows = load(f"{run_dir}/overlap_{ov}.jsonl", first)
        cells = []
        for key in ("exposed_comm_ms", "skew_ms", "local_lag_ms", "exposed_transfer_ms"):
            a, m, b = quartiles([r[key] for r in rows])
            bold = "**" if key == "exposed_transfer_ms" else ""
            cells.append(f"{a:.2f} / {bold}{m:.2f}{bold} / {b:.2f}")
            med[(ov, key)] = m
        step = statistics.median(r["step_ms"] for r in rows)
        comm = statistics.median(r["comm_ms"] for r in rows)
        name = "on" if ov == "true" else "off"
        print(f"| {label} | {name} | {step:.0f} | " + " | ".join(cells) + f" | {comm:.1f} |")
    off, on = med[("false", "exposed_transfer_ms")], med[("true", "exposed_transfer_ms")]
    raw_off, raw_on = med[("false", "exposed_comm_ms")], med[("true", "exposed_comm_ms")]
    print(f"hidden: exposed_transfer {100 * (1 - on / off):.0f} %, raw exposed_comm "
          f"{100 * (1 - raw_on / raw_off):.0f} %", file=sys.stderr)


if __name__ == "__main__":
    main()
