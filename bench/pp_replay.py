#!/usr/bin/env python3
"""A pipeline run's bubble, replayed from its own pass times.

The formula bubble of pp_bench.sh assumes every stage's F, B and W take
the same time and that each time is the same every micro-batch. A real run
on a shared machine has neither: one stage can be slower (its modules, or
a busier core), and a pass's time jitters. This script takes a run's
Chrome trace (log.trace) and re-runs its schedule on an ideal runtime:
each rank runs its passes in the trace's order, for the trace's durations,
and a pass starts once the rank is free and its input is there (the F of
the virtual stage before, the B of the one after, the rank's own B for a
W), with no time to hand it over. Two bubbles come out:

  stage   each (rank, pass kind, chunk)'s mean duration over the timed
          steps: the formula with the measured times of each stage, which
          counts the stages' imbalance;
  replay  each pass's own duration, step by step: imbalance and jitter.

measured - replay is what the runtime itself adds to the wait (handing
activations and gradients over, waking up, bookkeeping between passes);
replay - stage is the cost of jitter; stage - formula that of imbalance.
The bubble is the runtime's own measure: 1 - busy / (ranks x the longest
rank's span), every rank starting at 0.

  bench/pp_replay.py TRACE --pp P --schedule S [--virtual-stages V]
                     [--warmup W] [--times TF TB TW] [--json]

--times also replays the first timed step's pass order at those times:
`partrain bench schedule`'s bubble exactly, when the dependencies above are
the schedule's (pp_bench.sh checks this on every run).

Chunk c of rank r is virtual stage c*p + r (interleaved) or, for zbv,
r then 2p-1-r (the V)."""

import argparse
import json
import re
import statistics
import sys

PASS = re.compile(r"^(F|BW|B|W)(\d+)(?: c(\d+))?$")


def vstage(schedule, p, r, c):
    if schedule == "zbv":
        return r if c == 0 else 2 * p - 1 - r
    return c * p + r


def steps_of(trace, p, schedule, warmup):
    """{step: [per rank: [(kind, mb, vstage, chunk, ms)] in time order]}"""
    ev = json.load(open(trace))["traceEvents"]
    out = {}
    for e in sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "pipeline"),
                    key=lambda e: (e["pid"], e["ts"])):
        k = PASS.match(e["name"])
        step = e.get("args", {}).get("step", 0)
        if not k or step <= warmup:
            continue
        r, c = e["pid"], int(k.group(3) or 0)
        rows = out.setdefault(step, [[] for _ in range(p)])
        rows[r].append((k.group(1), int(k.group(2)), vstage(schedule, p, r, c), c, e["dur"] / 1e3))
    return out


def simulate(ranks, n_vstages):
    """Bubble of the passes `ranks` (per rank, in order) on an ideal runtime."""
    p = len(ranks)
    end, free, busy, pos = {}, [0.0] * p, [0.0] * p, [0] * p
    while any(pos[r] < len(ranks[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(ranks[r]):
                kind, mb, g, _, ms = ranks[r][pos[r]]
                if kind == "F":
                    dep = ("F", mb, g - 1) if g > 0 else None
                elif kind in ("B", "BW"):
                    dep = ("B", mb, g + 1) if g < n_vstages - 1 else ("F", mb, g)
                else:
                    dep = ("B", mb, g)
                if dep is not None and dep not in end:
                    break
                t = max(free[r], end[dep] if dep else 0.0) + ms
                end[("F" if kind == "F" else "W" if kind == "W" else "B", mb, g)] = t
                free[r], busy[r], pos[r], moved = t, busy[r] + ms, pos[r] + 1, True
        if not moved:
            sys.exit("pp_replay.py: the passes deadlock (a trace of another schedule?)")
    span = max(free)
    return 1 - sum(busy) / (p * span) if span > 0 else 0.0


def replay(trace, p, schedule, v, warmup, times=None):
    """The replayed bubbles of the trace's timed steps; with times {F, B, W}
    also "uniform", its first step's pass order at those times: the
    formula (`partrain bench schedule`) exactly, if the passes depend on one
    another here as they do in the runtime's schedule."""
    steps = steps_of(trace, p, schedule, warmup)
    if not steps:
        sys.exit("pp_replay.py: %s: no pipeline passes after step %d" % (trace, warmup))
    G = p * v
    per_step = [simulate(steps[s], G) for s in sorted(steps)]
    # each (rank, kind, chunk)'s mean duration, in each step's order
    durs = {}
    for s in steps.values():
        for r, row in enumerate(s):
            for kind, _, _, c, ms in row:
                durs.setdefault((r, kind, c), []).append(ms)
    mean = {k: statistics.mean(v) for k, v in durs.items()}
    stage = [simulate([[(k, mb, g, c, mean[(r, k, c)]) for k, mb, g, c, _ in row]
                       for r, row in enumerate(steps[s])], G) for s in sorted(steps)]
    out = {}
    if times:
        t = dict(times, BW=times["B"] + times["W"])
        first = steps[min(steps)]
        out["uniform"] = simulate([[(k, mb, g, c, t[k]) for k, mb, g, c, _ in row]
                                   for row in first], G)
    return dict(out, **{"steps": sorted(steps), "replay": per_step, "stage": stage,
            "replay_median": statistics.median(per_step), "stage_median": statistics.median(stage),
            "stage_ms": {"%d %s c%d" % k: v for k, v in sorted(mean.items())}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--schedule", required=True,
                    choices=("gpipe", "1f1b", "interleaved", "zb1", "zbv"))
    ap.add_argument("--virtual-stages", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--times", nargs=3, type=float, metavar=("TF", "TB", "TW"),
                    help="also the pass order at these F, B, W times (the formula's)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    v = a.virtual_stages or (2 if a.schedule == "zbv" else 1)
    times = dict(zip("FBW", a.times)) if a.times else None
    out = replay(a.trace, a.pp, a.schedule, v, a.warmup, times)
    if a.json:
        print(json.dumps(out))
        return
    for s, b, st in zip(out["steps"], out["replay"], out["stage"]):
        print("step %d: replay bubble %.3f, stage-mean bubble %.3f" % (s, b, st))
    print("median: replay %.3f, stage %.3f" % (out["replay_median"], out["stage_median"]))
    if "uniform" in out:
        print("at the times given: %.6f" % out["uniform"])


if __name__ == "__main__":
    main()
