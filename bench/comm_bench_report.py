#!/usr/bin/env python3
"""Markdown tables of `partrain bench comm --json` lines (one op): time per
operation and bus bandwidth per backend, shm / mpi_native and shm / memcpy.

    partrain bench comm --nproc 2 --ops allreduce --json > run.jsonl
    bench/comm_bench_report.py run.jsonl [OP]
"""
import json
import sys


def size_name(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


def main():
    path = sys.argv[1]
    op = sys.argv[2] if len(sys.argv) > 2 else "allreduce"
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r["op"] == op:
                rows.setdefault(r["bytes"], {})[r["backend"]] = r
    backends = [b for b in ("shm", "mpi", "mpi_native", "memcpy")
                if any(b in v for v in rows.values())]
    print(f"Time per {op} (µs):\n")
    print("| size | " + " | ".join(backends) + " |")
    print("| ---: |" + " ---: |" * len(backends))
    for b in sorted(rows):
        print(f"| {size_name(b)} | " +
              " | ".join(f"{rows[b][k]['usec']:.2f}" if k in rows[b] else "" for k in backends) + " |")
    print("\nBus bandwidth (GB/s; memcpy: bytes/time):\n")
    print("| size | " + " | ".join(backends) + " | shm / mpi_native | shm / memcpy |")
    print("| ---: |" + " ---: |" * (len(backends) + 2))
    for b in sorted(rows):
        v = rows[b]
        n = v["shm"]["ranks"]
        factor = {"allreduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
        # from the times (the JSON's bandwidths are rounded to 4 decimals)
        bw = {k: factor * b / v[k]["usec"] / 1e3 if k != "memcpy" else b / v[k]["usec"] / 1e3
              for k in backends if k in v}
        ratio = f"{bw['shm'] / bw['mpi_native']:.2f}×" if "mpi_native" in bw else ""
        frac = f"{100 * bw['shm'] / bw['memcpy']:.0f}%" if "memcpy" in bw else ""
        print(f"| {size_name(b)} | " + " | ".join(f"{bw[k]:.3f}" if k in bw else "" for k in backends)
              + f" | {ratio} | {frac} |")


if __name__ == "__main__":
    main()
