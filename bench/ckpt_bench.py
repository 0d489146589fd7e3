#!/usr/bin/env python3
"""Checkpoint benchmarks of issue 39 (docs/benchmarks.md, "Sliced checkpoints").

  bench/ckpt_bench.py speed  --new PARTRAIN --base PARTRAIN_6ebe248 [--rounds 3]
      configs/gpt2.json saved at dp 2 x tp 2 ZeRO-3 (4 ranks) and at pp 2 (2
      ranks), by this tree's partrain and by the rank-0 stream of 6ebe248,
      then loaded (--resume) by the same binary; beside them this disk's
      sequential write (dd conv=fdatasync) and read (dd, caches dropped)
      bandwidth, all interleaved round by round. The page cache is dropped
      before every save and load (as root; said so when it cannot be).
  bench/ckpt_bench.py async  --new PARTRAIN [--rounds 3] [--steps 40]
      configs/small.json at one worker: the wall time of the steps (first to
      last progress line, every step printed) without saves, with a save
      every 10 steps under checkpoint.async, and synchronous.
  bench/ckpt_bench.py matrix --new PARTRAIN
      configs/small.json saved at step 10 under each of dp 4, tp 2 x pp 2,
      dp 2 x tp 2 ZeRO-3, pp 4 interleaved and one worker, resumed under each
      of the others for 10 more steps: the largest relative difference of
      loss and gradient norm from the straight one-worker run, per pair.

Times come from the moment each stderr line arrives (the same clock for both
binaries): a save is from the step's progress line to "saved checkpoint"; a
load from the first open of a file of the step directory (strace -ttt of
openat, every rank) to the "world" line the run prints once every rank has
loaded. Run from the repository root with
data/ holding the fortunes data (ln -s /work/main/data data)."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GPT2_BYTES = None  # set from the files


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def stamped(cmd, env=None):
    """Run cmd; return [(wall-clock seconds, stderr line)]."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    lines = [(time.time(), line.rstrip("\n")) for line in p.stderr]
    p.wait()
    if p.returncode != 0:
        sys.exit("ckpt_bench: %s failed:\n%s" % (" ".join(cmd), "\n".join(l for _, l in lines[-5:])))
    return lines


def first_open(trace, text):
    """strace -ttt's time of the first openat of a path containing text."""
    for line in open(trace):
        if "openat(" in line and text in line:
            return float(line.split()[1])
    sys.exit("ckpt_bench: no open of %r in %s" % (text, trace))


def first(lines, text):
    for t, l in lines:
        if text in l:
            return t
    sys.exit("ckpt_bench: no line with %r in:\n%s" % (text, "\n".join(l for _, l in lines)))


def dd_write(path, mib):
    r = subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=%d" % mib,
                        "conv=fdatasync"], stderr=subprocess.PIPE, text=True, check=True)
    return r.stderr


def dd_rate(text):
    """dd's own figure, in MB/s."""
    last = text.strip().splitlines()[-1]
    n, unit = last.split(",")[-1].split()
    return float(n) * {"kB/s": 1e-3, "MB/s": 1, "GB/s": 1e3}[unit]


def speed(a):
    layouts = [("dp2 x tp2 zero3", 4, ["parallel.dp=2", "parallel.tp=2", "parallel.zero=3"]),
               ("pp2", 2, ["parallel.pp=2", "parallel.microbatches=2"])]
    bins = [("6ebe248", a.base), ("sliced", a.new)]
    work = tempfile.mkdtemp(prefix="ckbench-", dir=a.dir)
    rows = {}
    disk = {"write": [], "read": []}
    dropped = True
    for rnd in range(a.rounds):
        for name, n, keys in layouts:
            for tag, binary in bins:
                ck = os.path.join(work, "ck")
                shutil.rmtree(ck, ignore_errors=True)
                cmd = [binary, "train", "--config", "configs/gpt2.json", "--nproc", str(n),
                       "--set", "data.val=", "--set", "log.metrics=", "--set", "comm.timeout=600",
                       "--set", "checkpoint.dir=" + ck]
                for k in keys:
                    cmd += ["--set", k]
                dropped &= drop_caches()
                s = stamped(cmd + ["--set", "train.steps=1"])
                save = first(s, "saved checkpoint") - first(s, "step     1/1")
                step = os.path.join(ck, "step_00000001")
                nbytes = sum(os.path.getsize(os.path.join(step, f)) for f in os.listdir(step))
                dropped &= drop_caches()
                trace = os.path.join(work, "opens")
                r = stamped(["strace", "-f", "--seccomp-bpf", "-ttt", "-e", "trace=openat", "-o",
                             trace] + cmd + ["--set", "train.steps=2", "--resume"])
                load = first(r, "] info: world") - first_open(trace, "step_00000001/")
                rows.setdefault((name, tag), []).append((save, load, nbytes))
                print("round %d %-16s %-8s save %.2f s, load %.2f s, %.0f MB" %
                      (rnd + 1, name, tag, save, load, nbytes / 1e6), flush=True)
        f = os.path.join(work, "dd")
        disk["write"].append(dd_rate(dd_write(f, 1500)))
        dropped &= drop_caches()
        disk["read"].append(dd_rate(subprocess.run(["dd", "if=" + f, "of=/dev/null", "bs=1M"],
                                                   stderr=subprocess.PIPE, text=True).stderr))
        os.remove(f)
        print("round %d dd write %.0f MB/s, read %.0f MB/s" %
              (rnd + 1, disk["write"][-1], disk["read"][-1]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    w, rd = statistics.median(disk["write"]), statistics.median(disk["read"])
    print("\nmedian of %d interleaved rounds; page cache %s before every save and load" %
          (a.rounds, "dropped" if dropped else "NOT dropped (reads may be cached)"))
    print("| layout | binary | save s | save MB/s | of dd write | load s | load MB/s | of dd read |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, tag), v in rows.items():
        save = statistics.median(x[0] for x in v)
        load = statistics.median(x[1] for x in v)
        mb = v[0][2] / 1e6
        print("| %s | %s | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% |" %
              (name, tag, save, mb / save, 100 * mb / save / w, load, mb / load,
               100 * mb / load / rd))
    print("| dd (1.5 GB) | | | %.0f (write, fdatasync) | | | %.0f (read) | |" % (w, rd))


def step_span(lines):
    steps = [t for t, l in lines if l.startswith("step ") and "/" in l.split()[1]]
    return steps[-1] - steps[0], len(steps)


def async_bench(a):
    work = tempfile.mkdtemp(prefix="ckbench-", dir=a.dir)
    modes = [("no saves", []), ("async every 10", ["checkpoint.async=true"]),
             ("sync every 10", ["checkpoint.async=false"])]
    spans = {m: [] for m, _ in modes}
    for rnd in range(a.rounds):
        for m, keys in modes:
            ck = os.path.join(work, "ck")
            shutil.rmtree(ck, ignore_errors=True)
            cmd = [a.new, "train", "--config", "configs/small.json", "--set", "data.val=",
                   "--set", "log.metrics=", "--set", "log.every=1",
                   "--set", "train.steps=%d" % a.steps,
                   "--set", "checkpoint.dir=" + (ck if keys else ""),
                   "--set", "checkpoint.every=10"]
            for k in keys:
                cmd += ["--set", k]
            span, n = step_span(stamped(cmd))
            spans[m].append(span / (n - 1))
            print("round %d %-15s %.1f ms a step" % (rnd + 1, m, 1e3 * spans[m][-1]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(spans["no saves"])
    print("\n| saves | ms a step (median of %d) | vs no saves |" % a.rounds)
    print("| --- | --- | --- |")
    for m, _ in modes:
        v = statistics.median(spans[m])
        print("| %s | %.1f | %+.1f%% |" % (m, 1e3 * v, 100 * (v / base - 1)))


def metrics(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d:
            out[d["step"]] = (d["loss"], d["grad_norm"])
    return out


def matrix(a):
    layouts = [("dp4", 4, ["parallel.dp=4"]),
               ("tp2 x pp2", 4, ["parallel.tp=2", "parallel.pp=2", "parallel.microbatches=2"]),
               ("dp2 x tp2 zero3", 4, ["parallel.dp=2", "parallel.tp=2", "parallel.zero=3"]),
               ("pp4 interleaved", 4, ["parallel.pp=4", "parallel.microbatches=4",
                                       "parallel.schedule=interleaved"]),
               ("one worker", 1, [])]
    work = tempfile.mkdtemp(prefix="ckbench-", dir=a.dir)

    def train(n, keys, ck, m, extra):
        cmd = [a.new, "train", "--config", "configs/small.json", "--set", "data.val=",
               "--set", "log.metrics=" + m, "--set", "checkpoint.dir=" + ck,
               "--set", "checkpoint.every=10"] + extra
        if n > 1:
            cmd += ["--nproc", str(n)]
        for k in keys:
            cmd += ["--set", k]
        stamped(cmd)

    straight = os.path.join(work, "straight.jsonl")
    train(1, [], os.path.join(work, "s"), straight, ["--set", "train.steps=20"])
    ref = metrics(straight)
    for i, (name, n, keys) in enumerate(layouts):
        train(n, keys, os.path.join(work, "ck%d" % i), os.path.join(work, "save%d.jsonl" % i),
              ["--set", "train.steps=10"])
    print("| saved under \\ resumed under | " + " | ".join(l[0] for l in layouts) + " |")
    print("| --- " * (len(layouts) + 1) + "|")
    worst = 0
    for i, (name, _, _) in enumerate(layouts):
        row = []
        for j, (to, n, keys) in enumerate(layouts):
            if i == j:
                row.append("—")
                continue
            ck = os.path.join(work, "r%d_%d" % (i, j))
            shutil.copytree(os.path.join(work, "ck%d" % i), ck)
            m = os.path.join(work, "r%d_%d.jsonl" % (i, j))
            train(n, keys, ck, m, ["--set", "train.steps=20", "--resume"])
            got = metrics(m)
            d = max(max(abs(got[s][k] - ref[s][k]) / abs(ref[s][k]) for k in (0, 1))
                    for s in range(11, 21))
            worst = max(worst, d)
            row.append("%.1e" % d)
            shutil.rmtree(ck)
        print("| %s | %s |" % (name, " | ".join(row)), flush=True)
    print("\nlargest relative difference of loss and grad_norm, steps 11-20: %.1e (bound 1e-5)"
          % worst)
    shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["speed", "async", "matrix"])
    p.add_argument("--new", required=True)
    p.add_argument("--base")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: $TMPDIR)")
    a = p.parse_args()
    a.new = os.path.abspath(a.new)
    if a.base:
        a.base = os.path.abspath(a.base)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if a.what == "speed":
        speed(a)
    elif a.what == "async":
        async_bench(a)
    else:
        matrix(a)


main()
